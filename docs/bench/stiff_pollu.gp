set terminal pngcairo size 800,560 noenhanced
set output 'docs/bench/stiff_pollu.png'
set logscale xy
set xlabel 'time per solve (us), 1 thread'
set ylabel 'final-state error (controller norm)'
set title 'pollu: work-precision (rtol 1e-4, 1e-6, 1e-8)'
set key outside right
set grid
plot 'docs/bench/stiff_pollu.dat' index 0 with linespoints lw 2 title 'nabla_rodas5p', 'docs/bench/stiff_pollu.dat' index 1 with linespoints lw 2 title 'nabla_kvaerno5', 'docs/bench/stiff_pollu.dat' index 2 with linespoints lw 2 title 'nabla_kencarp5', 'docs/bench/stiff_pollu.dat' index 3 with linespoints lw 2 title 'nabla_ros3p', 'docs/bench/stiff_pollu.dat' index 4 with linespoints lw 2 title 'nabla_rosenbrock23', 'docs/bench/stiff_pollu.dat' index 5 with linespoints lw 2 title 'cvodes_bdf', 'docs/bench/stiff_pollu.dat' index 6 with linespoints lw 2 title 'diffrax_kvaerno5', 'docs/bench/stiff_pollu.dat' index 7 with linespoints lw 2 title 'diffrax_kencarp5', 'docs/bench/stiff_pollu.dat' index 8 with linespoints lw 2 title 'scipy_radau', 'docs/bench/stiff_pollu.dat' index 9 with linespoints lw 2 title 'scipy_bdf'
