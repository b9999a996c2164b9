/*
 * expat_compat: what differs between the expat of Debian 12 (2.5) and of
 * Debian 13 (2.9, which deprecates the line-number call of 2.5 in favour
 * of a 64-bit one; -Werror makes that fatal). Header only.
 */
#ifndef FERRY_EXPAT_COMPAT_H
#define FERRY_EXPAT_COMPAT_H

#include <expat.h>

/* The line of the parser's current position, for an error message. */
static inline unsigned long long xml_line(XML_Parser xp)
{
#if XML_MAJOR_VERSION > 2 || (XML_MAJOR_VERSION == 2 && XML_MINOR_VERSION >= 9)
	return (unsigned long long)XML_GetCurrentLineNumber64(xp);
#else
	return (unsigned long long)XML_GetCurrentLineNumber(xp);
#endif
}

#endif
