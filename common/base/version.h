/* version: what --version prints: the project version from CMake and, when
 * built from a git checkout, `git describe` of the tree ("0.1.0 (abc123)",
 * "-dirty" when it had uncommitted changes). */
#ifndef BLOOMGRID_VERSION_H
#define BLOOMGRID_VERSION_H

extern const char bloomgrid_version[];

#endif
