/* SPDX-License-Identifier: MIT */
/*
 * version.c - the version of the library as built: the header's macros,
 * generated from the one definition in CMakeLists.txt, frozen into the
 * binary so a program can compare them with the header it was compiled
 * against.
 */
#include "internal.h"

const char *kve_version(void)
{
    return KVEVICT_VERSION_STRING;
}

unsigned kve_version_number(void)
{
    return KVEVICT_VERSION_NUMBER;
}
