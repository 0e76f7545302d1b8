#include "version.h"

#include "bloomgrid_version.h" /* generated at build time (cmake/version.cmake) */

const char bloomgrid_version[] = BLOOMGRID_VERSION;
