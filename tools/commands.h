/*
 * commands.h -- the subcommands of the `nabla` program, one source file each.
 */
#ifndef NABLA_TOOLS_COMMANDS_H
#define NABLA_TOOLS_COMMANDS_H

/* `nabla train [options]` (train.c); argv holds the options only. Returns the exit code. */
int nabla_cmd_train(int argc, char **argv);

/* `nabla ode [options]` (ode.c): fit Lotka-Volterra's parameters through an ODE solve;
 * argv holds the options only. Returns the exit code. */
int nabla_cmd_ode(int argc, char **argv);

/* `nabla bench [options]` (bench.c): a reproducible optimizer benchmark suite -- problems x
 * optimizers x learning rates x seeds, with a CSV of every logged step, a JSON and Markdown
 * summary, gnuplot plots and the CSV's SHA-256. Returns the exit code. */
int nabla_cmd_bench(int argc, char **argv);

#endif
