/*
 * The step_observed line template, shared by the core's check of step lines (journal/_fast.c: step_lines,
 * step_records) and the views' column builder (journal/views/_fastcols.c: step_columns): which lines are canonical
 * step records, their numbers read and, where the arithmetic proves it, their spelling. Every function is static:
 * each extension that includes this gets its own copy. Needs Python.h, float.h, stdint.h and string.h first.
 */
#ifndef TRAINLEDGER_STEPLINES_H
#define TRAINLEDGER_STEPLINES_H

#ifndef SUFFIX
#define SUFFIX 72  /* ,"h":" + 64 hex + "} */
#endif

/* ---- verify's canonical check of step_observed lines without decoding them ---- */

/* A canonical int of the journal's int fields: 0, or an optional '-' and 1 to 19 digits without a leading zero,
 * within int64 (msgspec writes ints so; "-0", "01", "+1" and anything wider are left to msgspec). Returns the
 * length, or 0. */
static Py_ssize_t canon_int(const char *p, const char *end)
{
    const char *q = p;
    int neg = 0;
    if (q < end && *q == '-') {
        neg = 1;
        q++;
    }
    if (q >= end)
        return 0;
    if (*q == '0')
        return neg ? 0 : 1;
    const char *d = q;
    while (q < end && *q >= '0' && *q <= '9')
        q++;
    Py_ssize_t nd = q - d;
    if (nd == 0 || nd > 19)
        return 0;
    if (nd == 19 && memcmp(d, neg ? "9223372036854775808" : "9223372036854775807", 19) > 0)
        return 0;
    return q - p;
}

/* A JSON number (its spelling is checked afterwards, in bulk, by msgspec's own decode and re-encode). Returns the
 * length, or 0; at most 40 characters. */
static Py_ssize_t json_number(const char *p, const char *end)
{
    const char *q = p;
    if (q < end && *q == '-')
        q++;
    if (q >= end)
        return 0;
    if (*q == '0')
        q++;
    else if (*q >= '1' && *q <= '9')
        while (q < end && *q >= '0' && *q <= '9')
            q++;
    else
        return 0;
    if (q < end && *q == '.') {
        const char *f = ++q;
        while (q < end && *q >= '0' && *q <= '9')
            q++;
        if (q == f)
            return 0;
    }
    if (q < end && (*q == 'e' || *q == 'E')) {
        q++;
        if (q < end && (*q == '+' || *q == '-'))
            q++;
        const char *x = q;
        while (q < end && *q >= '0' && *q <= '9')
            q++;
        if (q == x)
            return 0;
    }
    return q - p > 40 ? 0 : q - p;
}

/* Whether the JSON number p[0:k] (json_number's length) is spelled exactly as msgspec writes the value it decodes
 * to, proven here without decoding it; 0 leaves it to msgspec's own decode and re-encode (never wrong, only slower).
 *
 * msgspec writes an int's digits (no leading zero, no "-0") and a float as the shortest decimal that reads back as
 * the same double, the nearest such to it, in fixed notation ("0.00001", "4096.0") when its decimal exponent is
 * within -5..15. A fixed-notation token of at most 15 significant digits is that decimal: two different decimals of
 * at most 15 digits never round to the same double (DBL_DIG). One of 16 or 17 digits D = M * 10^-k is that decimal
 * when the double x it rounds to is nearer to D than half a unit of D's last digit (no other decimal of its length
 * is as near) and neither multiple of ten units around D lies in x's rounding interval (no shorter decimal reads
 * back as x). Those are decided in 64-bit extended precision, where M and 10^k (k <= 21) are exact and each
 * product is off by at most 2^-7 units, with a margin of a quarter unit: a case within it is msgspec's. */
#if defined(__x86_64__) && LDBL_MANT_DIG == 64
#define NUMBER_PROOF 1
#define MARGIN 0.03125L /* 2^-5 units: four times the products' error */
static const long double POW10L[22] = {1e0L,  1e1L,  1e2L,  1e3L,  1e4L,  1e5L,  1e6L,  1e7L,  1e8L,  1e9L,  1e10L,
                                       1e11L, 1e12L, 1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L, 1e20L, 1e21L};

/* Whether long double arithmetic runs at its full 64 bits now: the x87 unit's precision can be lowered at run time
 * (fesetprec, a library's control word), and the proof below holds only at 64. */
static int x87_extended(void)
{
    volatile long double one = 1.0L, tiny = 0x1p-60L;
    return one + tiny != one;
}

static int long_digits_proven(uint64_t m, int k, double *out)
{
    if (!x87_extended())
        return 0; /* left to msgspec */
    long double q = (long double)m / POW10L[k]; /* M / 10^k rounded once, to 64 bits */
    double x = (double)q;                          /* and to 53: right unless q fell on a midpoint of doubles */
    uint64_t bits, hb;
    memcpy(&bits, &x, 8);
    uint64_t e = bits >> 52 & 0x7ff;               /* x is positive: M >= 10^15 */
    if (e <= 54)
        return 0;                                  /* far below msgspec's fixed notation */
    hb = (e - 53) << 52;                           /* half the spacing of doubles at x: 2^(e - 1023 - 53) */
    double hd;
    memcpy(&hd, &hb, 8);
    long double half = hd;
    long double below = (bits & 0xfffffffffffffULL) == 0 ? half / 2 : half; /* a power of two: closer below */
    if (fabsl(q - (long double)x) == half)
        return 0;
    long double y = (long double)x * POW10L[k];    /* x in units of D's last digit */
    if (fabsl(y - (long double)m) > 0.5L - MARGIN)
        return 0;
    long double lo = ((long double)x - below) * POW10L[k], hi = ((long double)x + half) * POW10L[k];
    uint64_t l = m / 10 * 10;
    *out = x;
    return (long double)l < lo - MARGIN && (long double)(l + 10) > hi + MARGIN;
}
#endif

static const double POW10D[22] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10,
                                  1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21};

/* number_proven, and the value the number reads as when it is proven: *iv for an int (*is_int 1), else *x (the
 * double msgspec decodes: m / 10^k with m < 2^53 and 10^k exact is one correctly rounded division; a 16- or
 * 17-digit one as the proof found it; an integral one its int part, converted once). */
static int number_read(const char *p, Py_ssize_t k, int *is_int, long long *iv, double *x)
{
    const char *q = p, *end = p + k;
    int neg = *q == '-';
    q += neg;
    const char *ip = q;
    while (q < end && *q >= '0' && *q <= '9')
        q++;
    Py_ssize_t ni = q - ip;
    if (ni == 0 || (*ip == '0' && ni > 1))
        return 0;
    if (q == end) { /* an int: msgspec keeps it one; "-0" reads back as 0 */
        if (ni > 18 || (*ip == '0' && neg))
            return 0;
        long long v = 0;
        for (const char *d = ip; d < end; d++)
            v = v * 10 + (*d - '0');
        *is_int = 1;
        *iv = neg ? -v : v;
        return 1;
    }
    if (*q != '.')
        return 0; /* an exponent: msgspec's below 1e-5 or from 1e16 on, left to it */
    const char *fp = ++q;
    while (q < end && *q >= '0' && *q <= '9')
        q++;
    Py_ssize_t nf = q - fp;
    if (q != end || nf == 0 || ni > 16 || (fp[nf - 1] == '0' && nf > 1))
        return 0; /* trailing zeros: "1.50"; ".0" only for an integral value */
    uint64_t m = 0;
    int digits = 0, scale = (int)nf; /* D = m * 10^-scale */
    const char *d = ip, *last = end;
    double v;
    *is_int = 0;
    if (nf == 1 && *fp == '0') { /* an integral value: "0.0", "-0.0", "4096.0"; its trailing zeros are not digits */
        uint64_t whole = 0;
        for (const char *w = ip; w < fp - 1; w++)
            whole = whole * 10 + (uint64_t)(*w - '0');
        *x = neg ? -(double)whole : (double)whole;
        if (*ip == '0')
            return 1;
        last = fp - 1;
        while (last[-1] == '0')
            last--;
        for (; d < last; d++)
            if (++digits > 16)
                return 0;
        /* 16 digits need every one of the 16 places (none was dropped): D is the whole int part */
#ifdef NUMBER_PROOF
        return digits <= 15 || long_digits_proven(whole, 0, &v);
#else
        return digits <= 15;
#endif
    }
    if (*ip == '0') { /* 0.000ddd: at most four zeros (1e-5 and up) */
        d = fp;
        while (*d == '0')
            d++;
        if (d - fp > 4)
            return 0;
    }
    for (; d < last; d++) {
        if (*d == '.')
            continue;
        if (++digits > 17)
            return 0;
        m = m * 10 + (uint64_t)(*d - '0');
    }
    if (digits <= 15) {
        v = (double)m / POW10D[scale];
    } else {
#ifdef NUMBER_PROOF
        if (!long_digits_proven(m, scale, &v))
            return 0;
#else
        return 0;
#endif
    }
    *x = neg ? -v : v;
    return 1;
}

static int number_proven(const char *p, Py_ssize_t k)
{
    int is_int;
    long long iv;
    double x;
    return number_read(p, k, &is_int, &iv, &x);
}

/* The fields of a step_observed record after "step", in the order msgspec writes them (StepObservedRecord;
 * journal/_scan.py checks this order against the record type at import). 'f': a number (int or float), 'i': an int.
 * Each is written only when not None (omit_defaults), "loss" always. */
#define STEP_KEY(s) s, sizeof s - 1
static const struct {
    const char *key; /* ,"name": */
    Py_ssize_t len;
    char type;
    char required;
} STEP_FIELDS[] = {
    {STEP_KEY(",\"loss\":"), 'f', 1},          {STEP_KEY(",\"grad_norm\":"), 'f', 0},
    {STEP_KEY(",\"lr\":"), 'f', 0},            {STEP_KEY(",\"step_time_s\":"), 'f', 0},
    {STEP_KEY(",\"examples\":"), 'i', 0},      {STEP_KEY(",\"tokens\":"), 'i', 0},
    {STEP_KEY(",\"supervised_tokens\":"), 'i', 0}, {STEP_KEY(",\"data_time_s\":"), 'f', 0},
    {STEP_KEY(",\"compute_time_s\":"), 'f', 0}, {STEP_KEY(",\"batch_fingerprint\":"), 'f', 0},
};

/* Whether line [p, end) (no newline) of a block scan_block passed is a step_observed record in canonical form
 * except for the spelling of its numbers, which go to out (comma-separated; with all 0, only those number_proven
 * leaves to msgspec). scan_block has held the line's end
 * to ,"seq":<digits>,"ts":<digits>,"h":"<64 hex>"} (no leading zeros, the seq expected, the hash the chain's);
 * what comes before it is checked here. 1 when it is; out is left as it was when it is not. */
/* A step line's numbers as step_line read them (mode 2): proven ones with their values, the rest to msgspec. */
typedef struct {
    int n;
    struct {
        int proven, is_int, f; /* f: its field, an index of STEP_FIELDS */
        long long iv;
        double x;
    } v[10];
    long long step, ints[10]; /* the int fields' values (ints[f] where present has bit f) */
    unsigned present;         /* bit f: field f of STEP_FIELDS is on the line */
} line_numbers;

/* The value of an int canon_int passed (within int64). */
static long long canon_value(const char *p, Py_ssize_t k)
{
    int neg = *p == '-';
    unsigned long long v = 0;
    for (Py_ssize_t i = neg; i < k; i++)
        v = v * 10 + (unsigned long long)(p[i] - '0');
    return neg ? (long long)(0ULL - v) : (long long)v;
}

static int step_line(const char *p, const char *end, char *out, Py_ssize_t *outlen, Py_ssize_t *count, int all,
                     line_numbers *got)
{
    static const char head[] = "{\"kind\":\"step_observed\",\"step\":";
    Py_ssize_t o = *outlen, c = *count, k;
    if (got != NULL)
        got->n = 0, got->present = 0;
    if (end - p < (Py_ssize_t)sizeof head - 1 + SUFFIX || memcmp(p, head, sizeof head - 1) != 0)
        return 0;
    p += sizeof head - 1;
    end -= SUFFIX; /* the hash's part, checked by scan_block */
    if (!(k = canon_int(p, end)))
        return 0;
    if (got != NULL)
        got->step = canon_value(p, k);
    p += k;
    for (size_t f = 0; f < sizeof STEP_FIELDS / sizeof STEP_FIELDS[0]; f++) {
        Py_ssize_t kl = STEP_FIELDS[f].len;
        if (end - p < kl || p[2] != STEP_FIELDS[f].key[2] || memcmp(p, STEP_FIELDS[f].key, (size_t)kl) != 0) {
            if (STEP_FIELDS[f].required)
                return 0;
            continue;
        }
        p += kl;
        if (got != NULL)
            got->present |= 1u << f;
        if (STEP_FIELDS[f].type == 'i') {
            if (!(k = canon_int(p, end)))
                return 0;
            if (got != NULL)
                got->ints[f] = canon_value(p, k);
        } else {
            if (!(k = json_number(p, end)))
                return 0;
            int proven;
            if (got != NULL) {
                int g = got->n++;
                got->v[g].f = (int)f;
                proven = got->v[g].proven = number_read(p, k, &got->v[g].is_int, &got->v[g].iv, &got->v[g].x);
            } else {
                proven = !all && number_proven(p, k);
            }
            if (!proven) {
                if (c)
                    out[o++] = ',';
                memcpy(out + o, p, (size_t)k);
                o += k;
                c++;
            }
        }
        p += k;
    }
    /* what is left: ,"seq":<digits>,"ts":<digits> exactly (their digits checked by scan_block) */
    if (end - p < 7 || memcmp(p, ",\"seq\":", 7) != 0)
        return 0;
    p += 7;
    while (p < end && *p >= '0' && *p <= '9')
        p++;
    if (end - p < 6 || memcmp(p, ",\"ts\":", 6) != 0)
        return 0;
    p += 6;
    while (p < end && *p >= '0' && *p <= '9')
        p++;
    if (p != end)
        return 0;
    *outlen = o;
    *count = c;
    return 1;
}

/* A line's ts (the digits scan_block held before ,"h":"), within int64; 0 when it is past int64 (where the records'
 * way decodes it instead). */
static inline int line_ts(const char *line, Py_ssize_t m, long long *ts)  /* inline: unused where only the check is built */
{
    Py_ssize_t i = m - SUFFIX, a = i;
    while (a > 0 && line[a - 1] >= '0' && line[a - 1] <= '9')
        a--;
    if (a == i || i - a > 19 || (i - a == 19 && memcmp(line + a, "9223372036854775807", 19) > 0))
        return 0;
    *ts = canon_value(line + a, i - a);
    return 1;
}

#define STEP_COLUMNS 11 /* step and the ten fields of STEP_FIELDS */

#endif
