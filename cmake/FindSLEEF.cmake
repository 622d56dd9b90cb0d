# FindSLEEF.cmake -- find SLEEF, the SIMD library of elementary functions.
#
# Imported target
#   SLEEF::sleef          the library with its include directory
#
# Result variables
#   SLEEF_FOUND, SLEEF_VERSION, SLEEF_INCLUDE_DIRS, SLEEF_LIBRARIES
#
# Cache variables (set them, or SLEEF_ROOT, to point at a non-system install)
#   SLEEF_INCLUDE_DIR     directory holding sleef.h
#   SLEEF_LIBRARY         the library file
#
# pkg-config (sleef.pc) is used only as a hint when it is available.

find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
    pkg_check_modules(PC_SLEEF QUIET sleef)
endif()

find_path(SLEEF_INCLUDE_DIR
    NAMES sleef.h
    HINTS ${PC_SLEEF_INCLUDEDIR} ${PC_SLEEF_INCLUDE_DIRS})
find_library(SLEEF_LIBRARY
    NAMES sleef
    HINTS ${PC_SLEEF_LIBDIR} ${PC_SLEEF_LIBRARY_DIRS})
mark_as_advanced(SLEEF_INCLUDE_DIR SLEEF_LIBRARY)

unset(SLEEF_VERSION)
if(SLEEF_INCLUDE_DIR AND EXISTS "${SLEEF_INCLUDE_DIR}/sleef.h")
    file(STRINGS "${SLEEF_INCLUDE_DIR}/sleef.h" _sleef_version_lines
         REGEX "^#define SLEEF_VERSION_(MAJOR|MINOR|PATCHLEVEL) +[0-9]+")
    foreach(_part IN ITEMS MAJOR MINOR PATCHLEVEL)
        string(REGEX MATCH "SLEEF_VERSION_${_part} +([0-9]+)" _m "${_sleef_version_lines}")
        set(_sleef_${_part} "${CMAKE_MATCH_1}")
    endforeach()
    if(NOT _sleef_MAJOR STREQUAL "" AND NOT _sleef_MINOR STREQUAL "")
        set(SLEEF_VERSION "${_sleef_MAJOR}.${_sleef_MINOR}")
        if(NOT _sleef_PATCHLEVEL STREQUAL "")
            string(APPEND SLEEF_VERSION ".${_sleef_PATCHLEVEL}")
        endif()
    endif()
    unset(_sleef_version_lines)
    unset(_sleef_MAJOR)
    unset(_sleef_MINOR)
    unset(_sleef_PATCHLEVEL)
    unset(_m)
endif()
if(NOT SLEEF_VERSION AND PC_SLEEF_VERSION)
    set(SLEEF_VERSION "${PC_SLEEF_VERSION}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(SLEEF
    REQUIRED_VARS SLEEF_LIBRARY SLEEF_INCLUDE_DIR
    VERSION_VAR SLEEF_VERSION
    REASON_FAILURE_MESSAGE "On Debian/Ubuntu: apt-get install libsleef-dev")

if(SLEEF_FOUND)
    set(SLEEF_INCLUDE_DIRS "${SLEEF_INCLUDE_DIR}")
    set(SLEEF_LIBRARIES "${SLEEF_LIBRARY}")
    if(NOT TARGET SLEEF::sleef)
        add_library(SLEEF::sleef UNKNOWN IMPORTED)
        set_target_properties(SLEEF::sleef PROPERTIES
            IMPORTED_LOCATION "${SLEEF_LIBRARY}"
            INTERFACE_INCLUDE_DIRECTORIES "${SLEEF_INCLUDE_DIR}")
    endif()
endif()
