/* The size grammar of transit_launch/rules.py in C, for the shim (TRANSIT_GPU_BUDGET,
 * TRANSIT_RESERVE, TRANSIT_MERGE_GAP) and the SPANK plugin (--transit-budget). Header-only
 * so that both link their own copy; tests/test_rules.py feeds the same table to this,
 * the plugin and Python. Integer arithmetic only: no strtod, so no locale, exponent,
 * hex, inf or nan, and no float-to-integer cast out of range. */
#ifndef TRANSIT_SIZE_H
#define TRANSIT_SIZE_H

#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "transit_rules.h"

enum { TR_SIZE_OK = 0, TR_SIZE_BAD = -1, TR_SIZE_TOO_SMALL = -2, TR_SIZE_TOO_LARGE = -3, TR_SIZE_NO_UNIT = -4 };

static inline int tr_size_digit(char c) { return c >= '0' && c <= '9'; }
static inline int tr_size_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

/* "40GB" -> 40e9 in *out; returns TR_SIZE_OK or the reason it is not a size. */
static inline int tr_size_parse(const char *s, uint64_t *out)
{
    static const struct { const char *unit; uint64_t mult; } units[] = TR_SIZE_UNITS;
    uint64_t whole = 0, frac = 0, scale = 1, mult = 0;
    int n = 0;
    if (!s)
        return TR_SIZE_BAD;
    for (; tr_size_digit(*s); s++, n++) {
        if (n == TR_SIZE_INT_DIGITS)
            return TR_SIZE_BAD;
        whole = whole * 10 + (uint64_t)(*s - '0');
    }
    if (n == 0)
        return TR_SIZE_BAD;
    if (*s == '.') {
        s++;
        for (n = 0; tr_size_digit(*s); s++, n++) {
            if (n == TR_SIZE_FRAC_DIGITS)
                return TR_SIZE_BAD;
            frac = frac * 10 + (uint64_t)(*s - '0');
            scale *= 10;
        }
        if (n == 0)
            return TR_SIZE_BAD;
    }
    if (*s == ' ' && tr_size_alpha(s[1]))
        s++;
    size_t len = strlen(s);
    if (len == 0) /* a bare number: refused, not read as bytes (4096B is bytes) */
        return TR_SIZE_NO_UNIT;
    if (len > 3)
        return TR_SIZE_BAD;
    for (size_t i = 0; i < len; i++)
        if (!tr_size_alpha(s[i]))
            return TR_SIZE_BAD;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (strcasecmp(s, units[i].unit) == 0)
            mult = units[i].mult;
    if (!mult)
        return TR_SIZE_BAD;
    if (whole > TR_SIZE_MAX || whole > TR_SIZE_MAX / mult)
        return TR_SIZE_TOO_LARGE;
    /* frac * mult / scale without the product, which wraps for PiB (frac < 1e6, mult 2^50):
     * mult = q * scale + r, so it is frac * q + frac * r / scale; frac * q < mult and
     * frac * r < scale^2 <= 1e12, and the floor is the same. */
    uint64_t q = mult / scale, r = mult % scale;
    uint64_t v = whole * mult + frac * q + frac * r / scale;
    if (v < 1)
        return TR_SIZE_TOO_SMALL;
    if (v > TR_SIZE_MAX)
        return TR_SIZE_TOO_LARGE;
    *out = v;
    return TR_SIZE_OK;
}

static inline const char *tr_size_reason(int rc)
{
    return rc == TR_SIZE_TOO_SMALL ? "must be at least one byte"
         : rc == TR_SIZE_TOO_LARGE ? "is larger than 1 PiB"
         : rc == TR_SIZE_NO_UNIT ? "has no unit (a size needs one: 40GB, 40GiB, or 40B for bytes)"
         : "is not a size (examples: " TR_SIZE_EXAMPLES ")";
}

#endif
