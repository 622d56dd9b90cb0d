# FindBLIS.cmake -- find BLIS, the BLAS-like Library Instantiation Software framework.
#
# Debian ships BLIS without pkg-config or CMake files, with blis.h chosen through the
# alternatives system (/usr/include/<multiarch>/blis.h); upstream `make install` puts it
# in <prefix>/include/blis/blis.h and writes blis.pc. Both layouts are handled.
#
# A single-threaded BLIS is preferred where Debian has one installed beside the default
# (libblis-serial-dev: <libdir>/<multiarch>/blis-serial and its own blis.h). nabla runs
# every BLIS call on one thread and parallelises around BLIS (src/ad/op_linalg.c); the
# default OpenMP variant still opens a parallel region of one thread per call -- a team
# set up and a futex wake-up system call, ~0.5 us on this machine, a fifth of a 32 x 192
# x 16 product's time. The products are the same (one thread either way). The library is
# linked by its full path, so its directory goes into the build RPATH of whatever links it
# and, through INSTALL_RPATH_USE_LINK_PATH (CMakeLists.txt), into installed libnabla.so's:
# the loader would otherwise pick the alternatives' default of the same soname (as it does
# for programs linking libnabla.a through pkg-config's -lblis: the same products, slower).
# A BLIS pointed at wins over the preference: BLIS_ROOT (variable or environment), a blis.pc
# found by pkg-config (an upstream install), a libblis under CMAKE_PREFIX_PATH, or
# BLIS_INCLUDE_DIR / BLIS_LIBRARY set by hand; BLIS_PREFER_SERIAL=OFF turns it off (and a
# build directory where this module chose the serial build searches again).
#
# Imported target
#   BLIS::blis            the library with its include directory
#
# Result variables
#   BLIS_FOUND, BLIS_VERSION (only when blis.pc or the header states it; Debian's
#   does not), BLIS_INCLUDE_DIRS, BLIS_LIBRARIES
#
# Cache variables (set them, or BLIS_ROOT, to point at a non-system install)
#   BLIS_INCLUDE_DIR      directory holding blis.h
#   BLIS_LIBRARY          the library file

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
    pkg_check_modules(PC_BLIS QUIET blis)
endif()

option(BLIS_PREFER_SERIAL "Prefer Debian's single-threaded BLIS variant when installed" ON)
mark_as_advanced(BLIS_PREFER_SERIAL)
set(_blis_pointed OFF)
if(BLIS_ROOT OR DEFINED ENV{BLIS_ROOT} OR PC_BLIS_FOUND)
    set(_blis_pointed ON)
elseif(CMAKE_PREFIX_PATH OR DEFINED ENV{CMAKE_PREFIX_PATH})
    find_library(_blis_in_prefix NAMES blis blis-mt NO_CACHE
        PATHS ${CMAKE_PREFIX_PATH} $ENV{CMAKE_PREFIX_PATH} PATH_SUFFIXES lib lib64
        NO_DEFAULT_PATH)
    if(_blis_in_prefix)
        set(_blis_pointed ON)
    endif()
endif()
set(_blis_want default)
if(BLIS_PREFER_SERIAL AND NOT _blis_pointed AND CMAKE_LIBRARY_ARCHITECTURE)
    set(_blis_want serial)
endif()
# what this module chose earlier (not paths set by hand), if the wish changed: search again
if(_BLIS_CHOICE AND NOT _BLIS_CHOICE STREQUAL _blis_want)
    unset(BLIS_INCLUDE_DIR CACHE)
    unset(BLIS_LIBRARY CACHE)
    set(_BLIS_CHOICE "" CACHE INTERNAL "")
endif()
set(_blis_choosing OFF)
if(NOT BLIS_LIBRARY AND NOT BLIS_INCLUDE_DIR) # NOTFOUND counts as not set
    set(_blis_choosing ON)
endif()
if(_blis_choosing AND _blis_want STREQUAL "serial")
    find_path(BLIS_SERIAL_INCLUDE_DIR NAMES blis.h
        PATHS "/usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/blis-serial" NO_DEFAULT_PATH)
    find_library(BLIS_SERIAL_LIBRARY NAMES blis
        PATHS "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/blis-serial" NO_DEFAULT_PATH)
    mark_as_advanced(BLIS_SERIAL_INCLUDE_DIR BLIS_SERIAL_LIBRARY)
    if(BLIS_SERIAL_INCLUDE_DIR AND BLIS_SERIAL_LIBRARY)
        set(BLIS_INCLUDE_DIR "${BLIS_SERIAL_INCLUDE_DIR}" CACHE PATH "directory holding blis.h"
            FORCE)
        set(BLIS_LIBRARY "${BLIS_SERIAL_LIBRARY}" CACHE FILEPATH "the BLIS library" FORCE)
    endif()
endif()
find_path(BLIS_INCLUDE_DIR
    NAMES blis.h
    HINTS ${PC_BLIS_INCLUDEDIR} ${PC_BLIS_INCLUDE_DIRS}
    PATH_SUFFIXES blis)
find_library(BLIS_LIBRARY
    NAMES blis blis-mt
    HINTS ${PC_BLIS_LIBDIR} ${PC_BLIS_LIBRARY_DIRS})
mark_as_advanced(BLIS_INCLUDE_DIR BLIS_LIBRARY)
if(_blis_choosing)
    set(_BLIS_CHOICE "${_blis_want}" CACHE INTERNAL "")
endif()

unset(BLIS_VERSION)
if(BLIS_INCLUDE_DIR AND EXISTS "${BLIS_INCLUDE_DIR}/blis.h")
    file(STRINGS "${BLIS_INCLUDE_DIR}/blis.h" _blis_version_line
         REGEX "^#define BLIS_VERSION_STRING +\"[^\"]*\"" LIMIT_COUNT 1)
    if(_blis_version_line MATCHES "\"([0-9]+(\\.[0-9]+)*)")
        set(BLIS_VERSION "${CMAKE_MATCH_1}")
    endif()
    unset(_blis_version_line)
endif()
if(NOT BLIS_VERSION AND PC_BLIS_VERSION)
    set(BLIS_VERSION "${PC_BLIS_VERSION}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(BLIS
    REQUIRED_VARS BLIS_LIBRARY BLIS_INCLUDE_DIR
    VERSION_VAR BLIS_VERSION
    REASON_FAILURE_MESSAGE "On Debian/Ubuntu: apt-get install libblis-dev")

if(BLIS_FOUND)
    set(BLIS_INCLUDE_DIRS "${BLIS_INCLUDE_DIR}")
    set(BLIS_LIBRARIES "${BLIS_LIBRARY}")
    if(NOT TARGET BLIS::blis)
        add_library(BLIS::blis UNKNOWN IMPORTED)
        set_target_properties(BLIS::blis PROPERTIES
            IMPORTED_LOCATION "${BLIS_LIBRARY}"
            INTERFACE_INCLUDE_DIRECTORIES "${BLIS_INCLUDE_DIR}")
    endif()
endif()
