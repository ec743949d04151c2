/*
 * The format core's optional accelerator (journal/accel.py loads it): the hash chain (format v1, docs/FORMAT.md
 * section 3), the verifier's block scan and its check of step lines, the Merkle tree's leaves and nodes (section
 * 4.1), and the writer's chain step (chain_append). The other layers have their own: the views' column builders
 * (journal/views/_fastcols.c) and the health folds' common step (training/health/_fastfolds.c).
 *
 *   h[n] = SHA-256("trainledger/v1/line" 0x00 || h[n-1] || P[n])
 *
 * Python's hashlib builds an OpenSSL EVP object per hash, which costs more than
 * hashing a 250-byte line; here the same OpenSSL SHA-256 runs on a stack
 * context. journal/accel.py falls back to hashlib when this module was not
 * built, and the tests check both paths agree.
 *
 * The verifier's block scan (scan_block, hash_range) hashes many independent messages at once: each line's chain
 * hash (from the hash stored in the line before it), each line's leaf, a tree level's nodes. Where the CPU has the
 * x86 SHA extensions they run four messages side by side (one message's rounds are a chain of dependent
 * instructions that leaves the unit idle between them); elsewhere OpenSSL hashes them one by one. Same bytes.
 */
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX: the step record's fields read from their slots */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

static const unsigned char LINE_TAG[20] = "trainledger/v1/line"; /* 19 chars + the 0x00 */
#define SUFFIX 72  /* ,"h":" + 64 hex + "} */

static void link_hash(const unsigned char *prev, const char *p, Py_ssize_t n, unsigned char *out)
{
    SHA256_CTX c;
    SHA256_Init(&c);
    SHA256_Update(&c, LINE_TAG, sizeof LINE_TAG);
    SHA256_Update(&c, prev, 32);
    SHA256_Update(&c, p, (size_t)n);
    SHA256_Final(out, &c);
}

static void to_hex(const unsigned char *raw, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = digits[raw[i] >> 4];
        out[2 * i + 1] = digits[raw[i] & 15];
    }
}

/* line_hash(prev: bytes, prefix: bytes) -> bytes: h[n] from h[n-1] and P[n]. */
static PyObject *line_hash(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0]) || !PyBytes_Check(args[1]) || PyBytes_GET_SIZE(args[0]) != 32) {
        PyErr_SetString(PyExc_TypeError, "line_hash(prev: 32 bytes, prefix: bytes)");
        return NULL;
    }
    unsigned char out[32];
    link_hash((const unsigned char *)PyBytes_AS_STRING(args[0]), PyBytes_AS_STRING(args[1]),
              PyBytes_GET_SIZE(args[1]), out);
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

/* Parse the decimal digits ending just before s[end]; return the start index or -1. */
static Py_ssize_t digits_before(const char *s, Py_ssize_t end, long long *value)
{
    Py_ssize_t i = end;
    while (i > 0 && s[i - 1] >= '0' && s[i - 1] <= '9' && end - i < 19)
        i--;
    if (i == end || (end - i > 1 && s[i] == '0'))
        return -1;
    long long v = 0;
    for (Py_ssize_t k = i; k < end; k++)
        v = v * 10 + (s[k] - '0');
    *value = v;
    return i;
}

/* A line's (no newline) end: ,"seq":<want_seq>,"ts":<digits>,"h":"<64 characters>"}. 0 when it holds. */
static int line_end_ok(const char *s, Py_ssize_t len, long long want_seq)
{
    if (len < SUFFIX + 16 || memcmp(s + len - SUFFIX, ",\"h\":\"", 6) != 0 || s[len - 2] != '"' || s[len - 1] != '}')
        return -1;
    long long ts, seq;
    Py_ssize_t a = digits_before(s, len - SUFFIX, &ts);
    if (a < 6 || memcmp(s + a - 6, ",\"ts\":", 6) != 0)
        return -1;
    Py_ssize_t b = digits_before(s, a - 6, &seq);
    if (b < 7 || memcmp(s + b - 7, ",\"seq\":", 7) != 0 || seq != want_seq)
        return -1;
    return 0;
}

/* The checks of check_lines on one line (no newline) given the previous hash; updates prev. 0 when they hold. */
static int check_one(unsigned char *prev, const char *s, Py_ssize_t len, long long want_seq)
{
    char hex[64];
    if (line_end_ok(s, len, want_seq) != 0)
        return -1;
    link_hash(prev, s, len - SUFFIX, prev);
    to_hex(prev, hex);
    return memcmp(hex, s + len - 66, 64) != 0 ? -1 : 0;
}

/*
 * check_lines(prev: bytes, lines: list[bytes], first_seq: int) -> int
 *
 * The per-line checks of a batch that need no JSON decoding. Line i (no
 * newline) must
 *   - end with ,"seq":<first_seq + i>,"ts":<digits>,"h":"<64 lowercase hex>"}
 *     where the hex is the h computed from the previous line's stored hash
 *     (prev for the first);
 *   - hold no '},{"kind":"' (one event object per line: with this true for
 *     every line, a batch decoded as one JSON array lines up with its lines).
 * Returns the index of the first line that fails, or -1 when all hold. The
 * caller then checks canonical form by decoding and re-encoding the batch.
 */
static PyObject *check_lines(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long first_seq;
    if (nargs != 3 || !PyBytes_Check(args[0]) || PyBytes_GET_SIZE(args[0]) != 32 || !PyList_Check(args[1]) ||
        !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "check_lines(prev: 32 bytes, lines: list[bytes], first_seq: int)");
        return NULL;
    }
    first_seq = PyLong_AsLongLong(args[2]);
    if (first_seq == -1 && PyErr_Occurred())
        return NULL;
    unsigned char prev[32];
    memcpy(prev, PyBytes_AS_STRING(args[0]), 32);
    PyObject *lines = args[1];
    Py_ssize_t n = PyList_GET_SIZE(lines);
    static const char boundary[] = "},{\"kind\":\"";
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *line = PyList_GET_ITEM(lines, i);
        if (!PyBytes_Check(line)) {
            PyErr_SetString(PyExc_TypeError, "check_lines: lines must be bytes");
            return NULL;
        }
        const char *s = PyBytes_AS_STRING(line);
        Py_ssize_t len = PyBytes_GET_SIZE(line);
        if (memmem(s, (size_t)len, boundary, sizeof boundary - 1) != NULL || check_one(prev, s, len, first_seq + i))
            return PyLong_FromSsize_t(i);
    }
    return PyLong_FromLong(-1);
}

/* ---- SHA-256 with the x86 SHA extensions, several independent messages at once ---- */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_SHANI_CODE 1
#include <immintrin.h>
#include <cpuid.h>

#define SHANI __attribute__((target("sha,sse4.1,ssse3")))

static const uint32_t SHA_K[64] __attribute__((aligned(16))) = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};
static const uint32_t SHA_IV[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

/* One lane's state in the SHA extensions' layout: s0 = ABEF, s1 = CDGH. */
typedef struct { __m128i s0, s1; } shani_state;

SHANI static inline shani_state shani_init(void)
{
    __m128i t = _mm_loadu_si128((const __m128i *)&SHA_IV[0]);  /* DCBA */
    __m128i s1 = _mm_loadu_si128((const __m128i *)&SHA_IV[4]); /* HGFE */
    t = _mm_shuffle_epi32(t, 0xB1);                              /* CDAB */
    s1 = _mm_shuffle_epi32(s1, 0x1B);                            /* EFGH */
    shani_state s;
    s.s0 = _mm_alignr_epi8(t, s1, 8);     /* ABEF */
    s.s1 = _mm_blend_epi16(s1, t, 0xF0);  /* CDGH */
    return s;
}

SHANI static inline void shani_digest(shani_state s, unsigned char *out)
{
    __m128i t = _mm_shuffle_epi32(s.s0, 0x1B);    /* FEBA */
    __m128i u = _mm_shuffle_epi32(s.s1, 0xB1);    /* DCHG */
    __m128i a = _mm_blend_epi16(t, u, 0xF0);      /* DCBA */
    __m128i b = _mm_alignr_epi8(u, t, 8);         /* HGFE */
    const __m128i bswap = _mm_set_epi8(12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3);
    _mm_storeu_si128((__m128i *)out, _mm_shuffle_epi8(a, bswap));
    _mm_storeu_si128((__m128i *)(out + 16), _mm_shuffle_epi8(b, bswap));
}

/* Compress one 64-byte block into each of K lanes, the lanes' rounds interleaved (each lane's rounds are a chain
 * of dependent instructions; independent lanes fill the pipeline). */
#define SHANI_LANES(K)                                                                                         \
    SHANI static void shani_x##K(shani_state *st, const unsigned char *const *blk)                            \
    {                                                                                                          \
        const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);                   \
        __m128i m[K][16], a[K], c[K];                                                                          \
        _Pragma("GCC unroll 4") for (int l = 0; l < K; l++) {                                                                          \
            a[l] = st[l].s0;                                                                                   \
            c[l] = st[l].s1;                                                                                   \
            for (int i = 0; i < 4; i++)                                                                        \
                m[l][i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(blk[l] + 16 * i)), mask);       \
        }                                                                                                      \
        _Pragma("GCC unroll 16") for (int i = 0; i < 16; i++) {                                                                         \
            const __m128i k = _mm_load_si128((const __m128i *)&SHA_K[4 * i]);                                  \
            _Pragma("GCC unroll 4") for (int l = 0; l < K; l++) {                                                                      \
                if (i >= 4)                                                                                    \
                    m[l][i] = _mm_sha256msg2_epu32(                                                            \
                        _mm_add_epi32(_mm_sha256msg1_epu32(m[l][i - 4], m[l][i - 3]),                          \
                                      _mm_alignr_epi8(m[l][i - 1], m[l][i - 2], 4)),                           \
                        m[l][i - 1]);                                                                          \
                __m128i w = _mm_add_epi32(m[l][i], k);                                                         \
                c[l] = _mm_sha256rnds2_epu32(c[l], a[l], w);                                                   \
                a[l] = _mm_sha256rnds2_epu32(a[l], c[l], _mm_shuffle_epi32(w, 0x0E));                          \
            }                                                                                                  \
        }                                                                                                      \
        for (int l = 0; l < K; l++) {                                                                          \
            st[l].s0 = _mm_add_epi32(st[l].s0, a[l]);                                                          \
            st[l].s1 = _mm_add_epi32(st[l].s1, c[l]);                                                          \
        }                                                                                                      \
    }
SHANI_LANES(1)
SHANI_LANES(4)

static int shani_usable(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 19)) || !(c & (1u << 9)))  /* SSE4.1, SSSE3 */
        return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    return (b >> 29) & 1;  /* SHA */
}
#endif

/* A message to hash: head (at most 64 bytes, copied) then body; the digest goes to out. */
typedef struct {
    const unsigned char *head;
    const unsigned char *body;
    unsigned char *out;
    unsigned hlen;
    size_t blen;
} shamsg;

static int use_shani = 0; /* set at import from cpuid; sha_ni() switches it (the tests run both paths) */

#ifdef HAVE_SHANI_CODE
/* Block j of m's padded message: a pointer into the body when the block lies inside it, else built in buf. */
static const unsigned char *msg_block(const shamsg *m, size_t j, size_t nblocks, unsigned char *buf)
{
    size_t total = m->hlen + m->blen, lo = 64 * j;
    if (lo >= m->hlen && lo + 64 <= total)
        return m->body + (lo - m->hlen);
    size_t k = 0; /* bytes of buf filled */
    if (lo < m->hlen) {
        k = m->hlen - lo < 64 ? m->hlen - lo : 64;
        memcpy(buf, m->head + lo, k);
    }
    if (k < 64 && lo + k < total) {
        size_t take = total - (lo + k) < 64 - k ? total - (lo + k) : 64 - k;
        memcpy(buf + k, m->body + (lo + k - m->hlen), take);
        k += take;
    }
    if (k < 64) {
        memset(buf + k, 0, 64 - k);
        if (total >= lo)
            buf[total - lo] = 0x80;
    }
    if (j == nblocks - 1) {
        uint64_t bits = (uint64_t)total * 8;
        for (int k = 0; k < 8; k++)
            buf[63 - k] = (unsigned char)(bits >> (8 * k));
    }
    return buf;
}

/* Hash count messages, four at a time in the SHA extensions' lanes (a lane takes the next message when its own
 * ends); the last few, fewer than four, one lane at a time. */
SHANI static void hash_messages_shani(const shamsg *m, size_t count)
{
    enum { K = 4 };
    shani_state st[K];
    size_t idx[K], j[K], nb[K], next = 0;
    int live[K] = {0, 0, 0, 0};
    unsigned char buf[K][64];
    for (;;) {
        int n_live = 0;
        for (int l = 0; l < K; l++) {
            if (!live[l] && next < count) {
                idx[l] = next++;
                j[l] = 0;
                nb[l] = (m[idx[l]].hlen + m[idx[l]].blen + 8) / 64 + 1;
                st[l] = shani_init();
                live[l] = 1;
            }
            n_live += live[l];
        }
        if (n_live == 0)
            return;
        const unsigned char *blk[K];
        if (n_live == K) {
            for (int l = 0; l < K; l++)
                blk[l] = msg_block(&m[idx[l]], j[l], nb[l], buf[l]);
            shani_x4(st, blk);
        } else {
            for (int l = 0; l < K; l++)
                if (live[l]) {
                    blk[0] = msg_block(&m[idx[l]], j[l], nb[l], buf[l]);
                    shani_x1(&st[l], blk);
                }
        }
        for (int l = 0; l < K; l++)
            if (live[l] && ++j[l] == nb[l]) {
                shani_digest(st[l], m[idx[l]].out);
                live[l] = 0;
            }
    }
}
#endif

static void hash_messages(const shamsg *m, size_t count)
{
#ifdef HAVE_SHANI_CODE
    if (use_shani) {
        hash_messages_shani(m, count);
        return;
    }
#endif
    for (size_t i = 0; i < count; i++) {
        SHA256_CTX c;
        SHA256_Init(&c);
        SHA256_Update(&c, m[i].head, m[i].hlen);
        SHA256_Update(&c, m[i].body, m[i].blen);
        SHA256_Final(m[i].out, &c);
    }
}

/* sha_ni(on: bool | None = None) -> bool: whether the batch hashing uses the x86 SHA extensions; on switches it
 * (refused, False, where the CPU or the build has none). For the tests: both paths give the same bytes. */
static PyObject *sha_ni(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "sha_ni(on: bool | None = None)");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        int on = PyObject_IsTrue(args[0]);
        if (on < 0)
            return NULL;
#ifdef HAVE_SHANI_CODE
        use_shani = on && shani_usable();
#endif
    }
    return PyBool_FromLong(use_shani);
}

/* One scratch area kept between calls (taken and given back with the GIL held, used without it): a block's
 * working arrays are a few hundred KiB, and allocating them afresh each time costs page faults. */
static void *scratch_cache = NULL;
static size_t scratch_cap = 0;

static void *scratch_take(size_t need, size_t *cap)
{
    void *p = scratch_cache;
    size_t c = scratch_cap;
    scratch_cache = NULL;
    scratch_cap = 0;
    if (p == NULL || c < need) {
        PyMem_Free(p);
        c = need;
        p = PyMem_Malloc(c);
    }
    *cap = c;
    return p;
}

static void scratch_give(void *p, size_t cap)
{
    if (scratch_cache == NULL && cap <= ((size_t)8 << 20)) { /* not the area of a block of one huge line */
        scratch_cache = p;
        scratch_cap = cap;
    } else {
        PyMem_Free(p);
    }
}

/* Lowercase hex digit values; 0x10 marks every other byte. Filled at import. */
static unsigned char HEX[256];

static void hex_table(void)
{
    memset(HEX, 0x10, sizeof HEX);
    for (int i = 0; i < 10; i++)
        HEX['0' + i] = (unsigned char)i;
    for (int i = 0; i < 6; i++)
        HEX['a' + i] = (unsigned char)(10 + i);
}

/* 64 lowercase hex digits to 32 bytes; -1 for anything else. Without a branch per digit: the digits of a hash are
 * random, and a branch on each would be mispredicted half the time. */
static int from_hex(const char *h, unsigned char *out)
{
    unsigned char bad = 0;
    for (int i = 0; i < 32; i++) {
        unsigned char a = HEX[(unsigned char)h[2 * i]], b = HEX[(unsigned char)h[2 * i + 1]];
        bad |= a | b;
        out[i] = (unsigned char)(a << 4 | (b & 15));
    }
    return bad & 0x10 ? -1 : 0;
}

/*
 * scan_block(prev: bytes, block: bytes, first_seq: int, leaves: bool) -> (bad, ends, last, leaf_hashes)
 *
 * check_lines over the lines of a block read from a journal (complete lines, each ending with a newline), without
 * splitting it: bad is the index of the first line that fails (-1 when all hold, and then the other three are
 * filled in), ends the offset of each line's newline in the block (uint32, native order), last the chain hash of
 * the last line (32 raw bytes), leaf_hashes each line's tree leaf hash (32 bytes each) when leaves is true, else
 * None. It does not look for a second event on a line: the caller holds the block to the byte-exact encoding of
 * one record per line (codec.decode_block), which a line holding two could not pass.
 *
 * Each line's chain hash is computed from the hash stored in the line before it (as _scan.py's ranges are), so
 * the lines' hashes, and their leaves, are independent messages hashed side by side (hash_messages).
 */
static PyObject *scan_block(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long first_seq;
    if (nargs != 4 || !PyBytes_Check(args[0]) || PyBytes_GET_SIZE(args[0]) != 32 || !PyBytes_Check(args[1]) ||
        !PyLong_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "scan_block(prev: 32 bytes, block: bytes, first_seq: int, leaves: bool)");
        return NULL;
    }
    first_seq = PyLong_AsLongLong(args[2]);
    if (first_seq == -1 && PyErr_Occurred())
        return NULL;
    int want_leaves = PyObject_IsTrue(args[3]);
    if (want_leaves < 0)
        return NULL;
    const char *s = PyBytes_AS_STRING(args[1]);
    Py_ssize_t len = PyBytes_GET_SIZE(args[1]);
    if (len > 0xFFFFFFFFLL || (len && s[len - 1] != '\n')) {
        PyErr_SetString(PyExc_ValueError, "scan_block: a block is complete lines under 4 GiB");
        return NULL;
    }
    /* At most this many lines can pass (a line is at least SUFFIX + 16 bytes and its newline): the arrays are
     * sized for them, then cut to the lines there are. A block far larger than a read (it holds a huge line) has
     * its lines counted instead, so that the arrays stay small. */
    Py_ssize_t n = len / (SUFFIX + 17) + 1;
    if (n > 8192) {
        n = 0;
        for (const char *q = s; (q = memchr(q, '\n', (size_t)(s + len - q))) != NULL; q++)
            n++;
    }
    PyObject *ends = PyBytes_FromStringAndSize(NULL, n * 4);
    PyObject *leaves = want_leaves ? PyBytes_FromStringAndSize(NULL, n * 32) : (Py_INCREF(Py_None), Py_None);
    /* per line: its messages, its stored hash, the head of its chain message (tag, previous hash), its computed
     * hash */
    const size_t HEAD = sizeof LINE_TAG + 32;
    size_t cap;
    shamsg *msgs = scratch_take((size_t)n * (2 * sizeof(shamsg) + 32 + HEAD + 32), &cap);
    unsigned char *work = (unsigned char *)(msgs + 2 * n);
    if (ends == NULL || leaves == NULL || msgs == NULL) {
        Py_XDECREF(ends);
        Py_XDECREF(leaves);
        PyMem_Free(msgs);
        return PyErr_NoMemory();
    }
    unsigned char *stored = work, *heads = work + 32 * n, *computed = heads + HEAD * n;
    static const unsigned char zero = 0;
    uint32_t *e = (uint32_t *)PyBytes_AS_STRING(ends);
    unsigned char *lv = want_leaves ? (unsigned char *)PyBytes_AS_STRING(leaves) : NULL;
    const unsigned char *prev = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t bad = -1, count = 0, lines = 0; /* lines: how many passed the structure checks */
    Py_BEGIN_ALLOW_THREADS
    const char *line = s;
    for (Py_ssize_t i = 0; line < s + len; i++) { /* the structure of each line, and the hashing it needs */
        const char *nl = memchr(line, '\n', (size_t)(s + len - line));
        if (i == n) /* more lines than long lines fit: one of them is short, and failed; cannot happen */
            break;
        Py_ssize_t m = nl - line;
        if (line_end_ok(line, m, first_seq + i) != 0 || from_hex(line + m - 66, stored + 32 * i) != 0)
            break;
        unsigned char *h = heads + HEAD * i;
        memcpy(h, LINE_TAG, sizeof LINE_TAG);
        memcpy(h + sizeof LINE_TAG, i ? stored + 32 * (i - 1) : prev, 32);
        msgs[count++] = (shamsg){h, (const unsigned char *)line, computed + 32 * i, (unsigned)HEAD, (size_t)(m - SUFFIX)};
        if (lv != NULL)
            msgs[count++] = (shamsg){&zero, (const unsigned char *)line, lv + 32 * i, 1, (size_t)m};
        e[i] = (uint32_t)(nl - s);
        line = nl + 1;
        lines = i + 1;
    }
    hash_messages(msgs, (size_t)count);
    for (Py_ssize_t i = 0; i < lines; i++) /* the first wrong hash, else the first line that failed its structure */
        if (memcmp(computed + 32 * i, stored + 32 * i, 32) != 0) {
            bad = i;
            break;
        }
    if (bad < 0 && line != s + len)
        bad = lines;
    Py_END_ALLOW_THREADS
    if (bad < 0 && (_PyBytes_Resize(&ends, lines * 4) < 0 || (lv != NULL && _PyBytes_Resize(&leaves, lines * 32) < 0))) {
        Py_XDECREF(ends);
        Py_XDECREF(leaves);
        scratch_give(msgs, cap);
        return NULL;
    }
    PyObject *out = Py_BuildValue("(nNy#N)", bad, ends, (const char *)(lines ? stored + 32 * (lines - 1) : prev),
                                  (Py_ssize_t)32, leaves);
    scratch_give(msgs, cap);
    return out;
}

#include "_slots.h"
#include "_steplines.h"

/*
 * step_lines(block: buffer, ends: bytes, mode: int = 1) -> (mask: bytes, numbers: bytes[, values: list, at: bytes])
 *
 * For a block of complete lines (ends: scan_block's newline offsets, uint32 each): mask[i] is 1 where line i is a
 * step_observed record in canonical form but for the spelling of its float fields' numbers, which are handed back
 * as one JSON array ("[n1,n2,...]", the lines' numbers in order) for the caller to check in one decode and one
 * re-encode with msgspec (and to build the records from: step_records). Every other line is 0 (the caller checks it
 * the ordinary way). mode 0: only the numbers number_proven cannot settle are handed back (a check alone). Mode 2:
 * those too, and the values of every number in order (what msgspec decodes them as), None where one is left to
 * msgspec, with where those are (at: uint32 indexes into values) for the caller to fill in from its decode.
 */
static PyObject *step_lines(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 2 || nargs > 3 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "step_lines(block: bytes, ends: bytes, mode: int = 1)");
        return NULL;
    }
    long mode = nargs < 3 ? 1 : PyLong_AsLong(args[2]);
    if (mode == -1 && PyErr_Occurred())
        return NULL;
    if (mode < 0 || mode > 2) {
        PyErr_SetString(PyExc_ValueError, "step_lines: mode is 0, 1 or 2");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const char *s = (const char *)view.buf;
    Py_ssize_t len = view.len, n = PyBytes_GET_SIZE(args[1]) / 4;
    const uint32_t *e = (const uint32_t *)PyBytes_AS_STRING(args[1]);
    PyObject *mask = PyBytes_FromStringAndSize(NULL, n);
    PyObject *nums = PyBytes_FromStringAndSize(NULL, len + 2);
    if (mask == NULL || nums == NULL) {
        Py_XDECREF(mask);
        Py_XDECREF(nums);
        PyBuffer_Release(&view);
        return NULL;
    }
    char *m = PyBytes_AS_STRING(mask), *out = PyBytes_AS_STRING(nums);
    Py_ssize_t o = 1, count = 0, start = 0;
    PyObject *vals = NULL, *at = NULL;
    uint32_t *where = NULL;
    Py_ssize_t nat = 0;
    line_numbers got;
    if (mode == 2) {
        vals = PyList_New(0);
        at = PyBytes_FromStringAndSize(NULL, len + 16); /* 4 bytes a number, which takes 7 or more of a line */
        if (vals == NULL || at == NULL)
            goto fail;
        where = (uint32_t *)PyBytes_AS_STRING(at);
    }
    out[0] = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t stop = (Py_ssize_t)e[i];
        if (stop >= len || stop < start) { /* not scan_block's offsets for this block */
            PyErr_SetString(PyExc_ValueError, "step_lines: ends do not fit the block");
            goto fail;
        }
        m[i] = (char)step_line(s + start, s + stop, out, &o, &count, mode == 1, vals != NULL ? &got : NULL);
        start = stop + 1;
        if (vals != NULL && m[i]) {
            for (int g = 0; g < got.n; g++) {
                PyObject *v;
                if (!got.v[g].proven) {
                    where[nat++] = (uint32_t)PyList_GET_SIZE(vals);
                    v = Py_None;
                    Py_INCREF(v);
                } else if (got.v[g].is_int) {
                    v = PyLong_FromLongLong(got.v[g].iv);
                } else {
                    v = PyFloat_FromDouble(got.v[g].x);
                }
                if (v == NULL || PyList_Append(vals, v) < 0) {
                    Py_XDECREF(v);
                    goto fail;
                }
                Py_DECREF(v);
            }
        }
    }
    PyBuffer_Release(&view);
    out[o++] = ']';
    if (_PyBytes_Resize(&nums, o) < 0) {
        Py_DECREF(mask);
        Py_XDECREF(vals);
        Py_XDECREF(at);
        return NULL;
    }
    if (vals == NULL)
        return Py_BuildValue("(NN)", mask, nums);
    if (_PyBytes_Resize(&at, 4 * nat) < 0) {
        Py_DECREF(mask);
        Py_DECREF(nums);
        Py_DECREF(vals);
        return NULL;
    }
    return Py_BuildValue("(NNNN)", mask, nums, vals, at);
fail:
    Py_DECREF(mask);
    Py_DECREF(nums);
    Py_XDECREF(vals);
    Py_XDECREF(at);
    PyBuffer_Release(&view);
    return NULL;
}

/* Digits (an optional '-', then at most 19 digits: what canon_int passed, or seq and ts) as a Python int, within
 * int64 as msgspec decodes them; NULL with no error set when not (the caller then decodes the block the ordinary
 * way). */
static PyObject *small_int(const char *p, Py_ssize_t k)
{
    int neg = k > 0 && *p == '-';
    unsigned long long v = 0;
    if (k - neg < 1 || k - neg > 19)
        return NULL;
    for (Py_ssize_t i = neg; i < k; i++) {
        unsigned d = (unsigned)(p[i] - '0');
        if (d > 9 || v > (ULLONG_MAX - d) / 10)
            return NULL;
        v = v * 10 + d;
    }
    if (v > (unsigned long long)LLONG_MAX + (unsigned long long)neg)
        return NULL;
    return neg ? PyLong_FromLongLong(v == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)v)
               : PyLong_FromLongLong((long long)v);
}

static PyObject *S_fields[14];
static const char *const FIELD_NAMES[14] = {"step", "loss", "grad_norm", "lr", "step_time_s", "examples", "tokens",
                                            "supervised_tokens", "data_time_s", "compute_time_s", "batch_fingerprint",
                                            "seq", "ts", "h"};

/* One step line [p, end) that step_line passed, as a record of step_type: each field put in its slot (offs), its
 * numbers taken in order from nums from *k on (msgspec's own decode of them: the same objects a decode of the line
 * would hold). 0 when it cannot be built this way (nothing is left allocated), -1 on an error. */
static int step_record(const char *p, const char *end, PyTypeObject *t, const Py_ssize_t *offs, PyObject *nums,
                       Py_ssize_t *k, PyObject **out)
{
    static const char head[] = "{\"kind\":\"step_observed\",\"step\":";
    PyObject *v[14] = {NULL};
    Py_ssize_t n;
    int f;
    p += sizeof head - 1;
    n = canon_int(p, end);
    if (!(v[0] = small_int(p, n)))
        goto fail;
    p += n;
    for (f = 0; f < 10; f++) {
        Py_ssize_t kl = STEP_FIELDS[f].len;
        if (end - p < kl || memcmp(p, STEP_FIELDS[f].key, (size_t)kl) != 0) {
            v[f + 1] = Py_None;
            Py_INCREF(Py_None);
            continue;
        }
        p += kl;
        if (STEP_FIELDS[f].type == 'i') {
            n = canon_int(p, end);
            if (!(v[f + 1] = small_int(p, n)))
                goto fail;
        } else {
            n = json_number(p, end);
            if (*k >= PyList_GET_SIZE(nums))
                goto fail;
            v[f + 1] = PyList_GET_ITEM(nums, *k);
            Py_INCREF(v[f + 1]);
            (*k)++;
        }
        p += n;
    }
    /* ,"seq":<digits>,"ts":<digits>,"h":"<64 hex>"} (held by scan_block and step_line) */
    const char *q;
    p += 7;
    for (q = p; *q >= '0' && *q <= '9'; q++)
        ;
    if (!(v[11] = small_int(p, q - p)))
        goto fail;
    p = q + 6;
    for (q = p; *q >= '0' && *q <= '9'; q++)
        ;
    if (!(v[12] = small_int(p, q - p)))
        goto fail;
    p = q + 6;
    if (end - p != 66)
        goto fail;
    if (!(v[13] = PyUnicode_New(64, 127)))
        goto fail;
    memcpy(PyUnicode_DATA(v[13]), p, 64);
    PyObject *rec = t->tp_alloc(t, 0);  /* zeroed, its type referenced */
    if (rec == NULL)
        goto fail;
    for (f = 0; f < 14; f++)
        *(PyObject **)((char *)rec + offs[f]) = v[f];  /* the reference moves into the slot */
    if (PyObject_IS_GC(rec))
        PyObject_GC_UnTrack(rec);  /* ints, floats, a str and None: nothing a collection could find, as msgspec does */
    *out = rec;
    return 1;
fail:
    for (f = 0; f < 14; f++)
        Py_XDECREF(v[f]);
    return PyErr_Occurred() ? -1 : 0;
}

/*
 * step_records(block, ends, mask, numbers, step_type) -> list | None
 *
 * The records of a block's step lines (mask[i] 1: step_lines passed line i) built from the line and the numbers
 * msgspec decoded for verify's check of their spelling (numbers, in order), without decoding the lines again; None
 * in the list for every other line (the caller has those decoded). None instead of the list when some line cannot
 * be built this way (an integer of more than 18 digits, a field the record does not keep in a slot): the caller
 * then decodes the block.
 */
static PyObject *step_records(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyBytes_Check(args[1]) || !PyBytes_Check(args[2]) || !PyList_CheckExact(args[3])
            || !PyType_Check(args[4])) {
        PyErr_SetString(PyExc_TypeError, "step_records(block, ends: bytes, mask: bytes, numbers: list, step_type)");
        return NULL;
    }
    PyTypeObject *t = (PyTypeObject *)args[4];
    Py_ssize_t offs[14];
    for (int f = 0; f < 14; f++)
        if ((offs[f] = slot_of(t, S_fields[f])) < (Py_ssize_t)sizeof(PyObject) || offs[f] > t->tp_basicsize - 8)
            Py_RETURN_NONE;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const char *s = (const char *)view.buf, *m = PyBytes_AS_STRING(args[2]);
    Py_ssize_t len = view.len, n = PyBytes_GET_SIZE(args[1]) / 4, k = 0, start = 0, i;
    const uint32_t *e = (const uint32_t *)PyBytes_AS_STRING(args[1]);
    PyObject *out = PyBytes_GET_SIZE(args[2]) == n ? PyList_New(n) : NULL;
    if (out == NULL) {
        PyBuffer_Release(&view);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "step_records: the mask does not fit the ends");
        return NULL;
    }
    for (i = 0; i < n; i++) {
        Py_ssize_t stop = (Py_ssize_t)e[i];
        PyObject *rec = Py_None;
        if (stop >= len || stop < start) {
            PyErr_SetString(PyExc_ValueError, "step_records: ends do not fit the block");
            goto error;
        }
        if (m[i]) {
            int r = step_record(s + start, s + stop, t, offs, args[3], &k, &rec);
            if (r < 0)
                goto error;
            if (r == 0)
                goto none;
        } else {
            Py_INCREF(Py_None);
        }
        PyList_SET_ITEM(out, i, rec);
        start = stop + 1;
    }
    PyBuffer_Release(&view);
    if (k != PyList_GET_SIZE(args[3])) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
none:
    PyBuffer_Release(&view);
    Py_DECREF(out);
    Py_RETURN_NONE;
error:
    PyBuffer_Release(&view);
    Py_DECREF(out);
    return NULL;
}

/*
 * join_lines(segs: list) -> (data: bytes, offsets: bytes, wide: bool)
 *
 * The lines of segments as one Arrow binary column's buffers, each line's bytes copied once and its newline left
 * out (scan.Lines.binary). A segment is (block, ends, i, j): lines i to j - 1 of a block of whole lines whose
 * newlines are at ends (uint32 each, a buffer), or (None, lines: list of bytes, i, j). offsets: int32 each, or
 * int64 where the lines hold 2 GiB or more (wide).
 */
static PyObject *join_lines(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "join_lines(segs: list)");
        return NULL;
    }
    PyObject *segs = args[0], *data = NULL, *offs = NULL, *out = NULL;
    Py_ssize_t nseg = PyList_GET_SIZE(segs), total = 0, count = 0;
    Py_buffer *views = PyMem_Calloc((size_t)(2 * nseg + 1), sizeof(Py_buffer));
    if (views == NULL)
        return PyErr_NoMemory();
    for (int pass = 0; pass < 2; pass++) {
        char *d = pass ? PyBytes_AS_STRING(data) : NULL;
        int wide = total > 0x7fffffffLL;
        Py_ssize_t at = 0, k = 0;
        if (pass) {
            if (wide)
                ((int64_t *)PyBytes_AS_STRING(offs))[0] = 0;
            else
                ((int32_t *)PyBytes_AS_STRING(offs))[0] = 0;
        }
        for (Py_ssize_t g = 0; g < nseg; g++) {
            PyObject *seg = PyList_GET_ITEM(segs, g);
            Py_ssize_t i, j;
            if (!PyTuple_Check(seg) || PyTuple_GET_SIZE(seg) != 4) {
                PyErr_SetString(PyExc_TypeError, "join_lines: a segment is (block, ends, i, j)");
                goto done;
            }
            i = PyLong_AsSsize_t(PyTuple_GET_ITEM(seg, 2));
            j = PyLong_AsSsize_t(PyTuple_GET_ITEM(seg, 3));
            if ((i == -1 || j == -1) && PyErr_Occurred())
                goto done;
            PyObject *block = PyTuple_GET_ITEM(seg, 0), *ends = PyTuple_GET_ITEM(seg, 1);
            const char *b = NULL;
            const uint32_t *e = NULL;
            Py_ssize_t blen = 0, n;
            if (block == Py_None) {
                if (!PyList_Check(ends) || i < 0 || j < i || j > PyList_GET_SIZE(ends)) {
                    PyErr_SetString(PyExc_ValueError, "join_lines: a segment's lines do not fit it");
                    goto done;
                }
            } else {
                Py_buffer *bv = &views[2 * g], *ev = &views[2 * g + 1];
                if (!pass) {
                    if (PyObject_GetBuffer(block, bv, PyBUF_SIMPLE) < 0 || PyObject_GetBuffer(ends, ev, PyBUF_SIMPLE) < 0)
                        goto done;
                }
                b = (const char *)bv->buf;
                blen = bv->len;
                e = (const uint32_t *)ev->buf;
                n = ev->len / 4;
                if (i < 0 || j < i || j > n) {
                    PyErr_SetString(PyExc_ValueError, "join_lines: a segment's lines do not fit it");
                    goto done;
                }
            }
            for (Py_ssize_t x = i; x < j; x++) {
                const char *p;
                Py_ssize_t len;
                if (b == NULL) {
                    PyObject *line = PyList_GET_ITEM(ends, x);
                    if (!PyBytes_Check(line)) {
                        PyErr_SetString(PyExc_TypeError, "join_lines: a line is bytes");
                        goto done;
                    }
                    p = PyBytes_AS_STRING(line);
                    len = PyBytes_GET_SIZE(line);
                } else {
                    Py_ssize_t start = x ? (Py_ssize_t)e[x - 1] + 1 : 0, stop = (Py_ssize_t)e[x];
                    if (stop < start || stop >= blen) {
                        PyErr_SetString(PyExc_ValueError, "join_lines: ends do not fit the block");
                        goto done;
                    }
                    p = b + start;
                    len = stop - start;
                }
                if (!pass) {
                    total += len;
                    count++;
                    continue;
                }
                memcpy(d + at, p, (size_t)len);
                at += len;
                k++;
                if (wide)
                    ((int64_t *)PyBytes_AS_STRING(offs))[k] = at;
                else
                    ((int32_t *)PyBytes_AS_STRING(offs))[k] = (int32_t)at;
            }
        }
        if (!pass) {
            data = PyBytes_FromStringAndSize(NULL, total);
            offs = PyBytes_FromStringAndSize(NULL, (count + 1) * (total > 0x7fffffffLL ? 8 : 4));
            if (data == NULL || offs == NULL)
                goto done;
        } else
            out = Py_BuildValue("(OOO)", data, offs, wide ? Py_True : Py_False);
    }
done:
    for (Py_ssize_t v = 0; v < 2 * nseg; v++)
        if (views[v].obj != NULL)
            PyBuffer_Release(&views[v]);
    PyMem_Free(views);
    Py_XDECREF(data);
    Py_XDECREF(offs);
    return out;
}

/* ---- RFC 6962 Merkle tree over the journal's lines (format 1.3, docs/FORMAT.md) ---- */

static void leaf_of(const char *p, Py_ssize_t n, unsigned char *out)
{
    static const unsigned char zero = 0;
    SHA256_CTX c;
    SHA256_Init(&c);
    SHA256_Update(&c, &zero, 1);
    SHA256_Update(&c, p, (size_t)n);
    SHA256_Final(out, &c);
}

static void node_of(const unsigned char *l, const unsigned char *r, unsigned char *out)
{
    static const unsigned char one = 1;
    SHA256_CTX c;
    SHA256_Init(&c);
    SHA256_Update(&c, &one, 1);
    SHA256_Update(&c, l, 32);
    SHA256_Update(&c, r, 32);
    SHA256_Final(out, &c);
}

/* leaf_range(begin: int, lines: list[bytes]) -> list[tuple[int, bytes]]: the leaves [begin, begin + len(lines))
 * as the fewest perfect subtrees aligned to the tree, (height, hash) left to right (journal.merkle.CompactRange). */
static PyObject *leaf_range(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long begin;
    if (nargs != 2 || !PyList_Check(args[1]) || (begin = PyLong_AsLongLong(args[0])) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "leaf_range(begin: int >= 0, lines: list[bytes])");
        return NULL;
    }
    PyObject *lines = args[1];
    Py_ssize_t n = PyList_GET_SIZE(lines);
    int heights[160]; /* a range of under 2**64 leaves holds at most 128 subtrees */
    unsigned char hashes[160][32];
    int top = 0;
    unsigned long long end = (unsigned long long)begin;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *line = PyList_GET_ITEM(lines, i);
        if (!PyBytes_Check(line)) {
            PyErr_SetString(PyExc_TypeError, "leaf_range: lines must be bytes");
            return NULL;
        }
        unsigned char cur[32];
        leaf_of(PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line), cur);
        int h = 0;
        end += 1;
        while (top > 0 && heights[top - 1] == h && (((end >> h) - 1) & 1)) {
            node_of(hashes[top - 1], cur, cur);
            top--;
            h++;
        }
        heights[top] = h;
        memcpy(hashes[top], cur, 32);
        top++;
    }
    PyObject *out = PyList_New(top);
    for (int k = 0; out != NULL && k < top; k++) {
        PyObject *t = Py_BuildValue("(iy#)", heights[k], (const char *)hashes[k], (Py_ssize_t)32);
        if (t == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, k, t);
    }
    return out;
}

/* hash_range(begin: int, hashes: bytes) -> list[tuple[int, bytes]]: leaf_range for leaves given as their hashes
 * (32 bytes each, concatenated: scan_block's leaf_hashes). Built a level at a time, so that the nodes of a level,
 * independent of each other, are hashed side by side (hash_messages): at each level an element with no sibling in
 * the range (an odd first index, an even last one) is a subtree of the range's edge, and the rest pair up. */
static PyObject *hash_range(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long begin;
    Py_buffer b;
    if (nargs != 2 || (begin = PyLong_AsLongLong(args[0])) < 0 || PyObject_GetBuffer(args[1], &b, PyBUF_SIMPLE) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "hash_range(begin: int >= 0, hashes: bytes)");
        return NULL;
    }
    if (b.len % 32) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "hash_range: not a whole number of 32-byte hashes");
        return NULL;
    }
    Py_ssize_t n = b.len / 32;
    size_t cap;
    shamsg *msgs = scratch_take((size_t)(n / 2 + 1) * (sizeof(shamsg) + 64), &cap);
    unsigned char *scratch = (unsigned char *)(msgs + n / 2 + 1);
    if (msgs == NULL) {
        PyBuffer_Release(&b);
        return PyErr_NoMemory();
    }
    int lh[64], rh[64], nl = 0, nr = 0;
    unsigned char left[64][32], right[64][32];
    static const unsigned char one = 1;
    Py_BEGIN_ALLOW_THREADS
    unsigned long long lo = (unsigned long long)begin, hi = lo + (unsigned long long)n;
    const unsigned char *cur = (const unsigned char *)b.buf;
    unsigned char *bufs[2] = {scratch, scratch + (n / 2 + 1) * 32};
    for (int h = 0; lo < hi; h++) {
        if (lo & 1) {
            lh[nl] = h;
            memcpy(left[nl++], cur, 32);
            cur += 32;
            lo++;
        }
        if (lo < hi && (hi & 1)) {
            hi--;
            rh[nr] = h;
            memcpy(right[nr++], cur + 32 * (hi - lo), 32);
        }
        size_t pairs = (size_t)(hi - lo) / 2;
        unsigned char *next = bufs[h & 1];
        for (size_t k = 0; k < pairs; k++)
            msgs[k] = (shamsg){&one, cur + 64 * k, next + 32 * k, 1, 64};
        hash_messages(msgs, pairs);
        cur = next;
        lo /= 2;
        hi /= 2;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b);
    PyObject *out = PyList_New(nl + nr);
    for (int k = 0; out != NULL && k < nl + nr; k++) {
        PyObject *t = k < nl ? Py_BuildValue("(iy#)", lh[k], (const char *)left[k], (Py_ssize_t)32)
                             : Py_BuildValue("(iy#)", rh[nl + nr - 1 - k], (const char *)right[nl + nr - 1 - k],
                                             (Py_ssize_t)32);
        if (t == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, k, t);
    }
    scratch_give(msgs, cap);
    return out;
}

/* Read a (height, hash) node of a compact range's list. */
static int node_at(PyObject *nodes, Py_ssize_t i, long *height, const unsigned char **hash)
{
    PyObject *t = PyList_GET_ITEM(nodes, i);
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 2 || !PyLong_Check(PyTuple_GET_ITEM(t, 0)) ||
        !PyBytes_Check(PyTuple_GET_ITEM(t, 1)) || PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 1)) != 32) {
        PyErr_SetString(PyExc_TypeError, "a compact range's nodes are (height: int, hash: 32 bytes)");
        return -1;
    }
    *height = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
    if ((*height == -1 && PyErr_Occurred()) || *height < 0 || *height > 63) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "a compact range's node heights are 0..63");
        return -1;
    }
    *hash = (const unsigned char *)PyBytes_AS_STRING(PyTuple_GET_ITEM(t, 1));
    return 0;
}

/*
 * block_range(begin: int, buf: bytes-like, start: int) -> list[tuple[int, bytes]]: leaf_range of the whole lines of
 * buf[start:] (each ends in a newline, which is not part of its leaf), without a list of lines: the writer's batch of
 * buffered lines joins its tree as it lies in the buffer, the leaves hashed four at a time where the CPU has the SHA
 * extensions, then the nodes as hash_range makes them.
 */
static PyObject *block_range(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long begin;
    Py_ssize_t start;
    Py_buffer b;
    if (nargs != 3 || (begin = PyLong_AsLongLong(args[0])) < 0 || (start = PyLong_AsSsize_t(args[2])) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "block_range(begin: int >= 0, buf, start: int >= 0)");
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &b, PyBUF_SIMPLE) < 0)
        return NULL;
    const char *p = (const char *)b.buf + (start < b.len ? start : b.len), *end = (const char *)b.buf + b.len;
    if (start > b.len || (p < end && end[-1] != '\n')) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "block_range: buf[start:] is not whole lines");
        return NULL;
    }
    Py_ssize_t n = 0;
    for (const char *q = p; q < end && (q = memchr(q, '\n', (size_t)(end - q))) != NULL; q++)
        n++;
    PyObject *leaves = PyBytes_FromStringAndSize(NULL, n * 32);
    shamsg *msgs = n ? PyMem_Malloc((size_t)n * sizeof(shamsg)) : NULL;
    if (leaves == NULL || (n && msgs == NULL)) {
        Py_XDECREF(leaves);
        PyBuffer_Release(&b);
        return PyErr_NoMemory();
    }
    static const unsigned char zero = 0;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(leaves);
    for (Py_ssize_t i = 0; i < n; i++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        msgs[i].head = &zero;
        msgs[i].hlen = 1;
        msgs[i].body = (const unsigned char *)p;
        msgs[i].blen = (size_t)(nl - p);
        msgs[i].out = o + 32 * i;
        p = nl + 1;
    }
    Py_BEGIN_ALLOW_THREADS
    hash_messages(msgs, (size_t)n);
    Py_END_ALLOW_THREADS
    PyMem_Free(msgs);
    PyBuffer_Release(&b);
    PyObject *hargs[2] = {args[0], leaves};
    PyObject *out = hash_range(self, hargs, 2);
    Py_DECREF(leaves);
    return out;
}

/* range_merge(nodes: list, end: int, other: list) -> int: journal.merkle.CompactRange.merge of the range whose
 * nodes are other (beginning at end) into nodes, in place; returns the new end. */
static PyObject *range_merge(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    unsigned long long end;
    if (nargs != 3 || !PyList_Check(args[0]) || !PyList_Check(args[2]) || !PyLong_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "range_merge(nodes: list, end: int, other: list)");
        return NULL;
    }
    end = PyLong_AsUnsignedLongLong(args[1]);
    if (end == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    PyObject *nodes = args[0], *other = args[2];
    Py_ssize_t n_other = PyList_GET_SIZE(other);
    for (Py_ssize_t k = 0; k < n_other; k++) {
        long height;
        const unsigned char *hp;
        if (node_at(other, k, &height, &hp) < 0)
            return NULL;
        if (end % (1ULL << height)) {
            PyErr_SetString(PyExc_ValueError, "a subtree is not aligned where it lands");
            return NULL;
        }
        unsigned char h[32];
        memcpy(h, hp, 32);
        end += 1ULL << height;
        /* merge with the left neighbour while they are siblings: same height, and this one is a right child */
        for (;;) {
            Py_ssize_t top = PyList_GET_SIZE(nodes);
            long lh;
            const unsigned char *lp;
            if (top == 0)
                break;
            if (node_at(nodes, top - 1, &lh, &lp) < 0)
                return NULL;
            if (lh != height || !(((end >> height) - 1) & 1))
                break;
            node_of(lp, h, h);
            if (PyList_SetSlice(nodes, top - 1, top, NULL) < 0)
                return NULL;
            height++;
        }
        PyObject *t = Py_BuildValue("(ly#)", height, (const char *)h, (Py_ssize_t)32);
        if (t == NULL || PyList_Append(nodes, t) < 0) {
            Py_XDECREF(t);
            return NULL;
        }
        Py_DECREF(t);
    }
    return PyLong_FromUnsignedLongLong(end);
}

/* range_root(nodes: list) -> bytes: the root a compact range from leaf 0 folds to (nodes not empty). */
static PyObject *range_root(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 || !PyList_Check(args[0]) || PyList_GET_SIZE(args[0]) == 0) {
        PyErr_SetString(PyExc_TypeError, "range_root(nodes: non-empty list)");
        return NULL;
    }
    PyObject *nodes = args[0];
    Py_ssize_t n = PyList_GET_SIZE(nodes);
    long height;
    const unsigned char *hp;
    unsigned char r[32];
    if (node_at(nodes, n - 1, &height, &hp) < 0)
        return NULL;
    memcpy(r, hp, 32);
    for (Py_ssize_t k = n - 2; k >= 0; k--) {
        if (node_at(nodes, k, &height, &hp) < 0)
            return NULL;
        node_of(hp, r, r);
    }
    return PyBytes_FromStringAndSize((const char *)r, 32);
}

/* leaf_hashes(lines: list[bytes]) -> bytes: the leaf hashes, 32 bytes each, concatenated. */
static PyObject *leaf_hashes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "leaf_hashes(lines: list[bytes])");
        return NULL;
    }
    PyObject *lines = args[0];
    Py_ssize_t n = PyList_GET_SIZE(lines);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyBytes_Check(PyList_GET_ITEM(lines, i))) {
            PyErr_SetString(PyExc_TypeError, "leaf_hashes: lines must be bytes");
            return NULL;
        }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * 32);
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *line = PyList_GET_ITEM(lines, i);
        leaf_of(PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line), o + 32 * i);
    }
    return out;
}

/* node_level(hashes: bytes) -> bytes: node hashes of consecutive pairs (an odd last hash is left out). */
static PyObject *node_level(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_buffer b;
    if (nargs != 1 || PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "node_level(hashes: bytes)");
        return NULL;
    }
    if (b.len % 32) {
        PyBuffer_Release(&b);
        PyErr_SetString(PyExc_ValueError, "node_level: not a whole number of 32-byte hashes");
        return NULL;
    }
    Py_ssize_t pairs = b.len / 64;
    PyObject *out = PyBytes_FromStringAndSize(NULL, pairs * 32);
    if (out != NULL) {
        const unsigned char *in = (const unsigned char *)b.buf;
        unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < pairs; i++)
            node_of(in + 64 * i, in + 64 * i + 32, o + 32 * i);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&b);
    return out;
}

/* type_run(items, i, type) -> j: the end of the run of items of exactly that type from i (replay's runs of steps). */
static PyObject *type_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyType_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "type_run(items: list, i: int, type)");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[1]), n = PyList_GET_SIZE(args[0]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0)
        i = 0;
    while (i < n && Py_TYPE(PyList_GET_ITEM(args[0], i)) == (PyTypeObject *)args[2])
        i++;
    return PyLong_FromSsize_t(i);
}

/* ---- the writer's append ---- */

static char *put_u64(char *o, unsigned long long v)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *o++ = tmp[--n];
    return o;
}

/* The most a line's chain suffix adds to its body less '}': ,"seq": and 20 digits, ,"ts": and 20 digits, ,"h":" +
 * 64 hex + "} and the newline. */
#define CHAIN_ROOM (7 + 20 + 6 + 20 + 6 + 64 + 3)

/* A line of the chain finished in place: start holds the event's body, its '}' at start[blen - 1]; that brace and
 * what follows become ,"seq":SEQ,"ts":TS,"h":"HEX"} and a newline (CHAIN_ROOM bytes at most past it), where the hash
 * d = SHA-256(tag || prev || the line before ,"h"). Returns the line's length with its newline; the hex sits 67
 * bytes before its end. */
static Py_ssize_t chain_line(char *start, Py_ssize_t blen, const unsigned char *prev, unsigned long long seq,
                             unsigned long long ts, unsigned char *d)
{
    char *o = start + blen - 1;
    memcpy(o, ",\"seq\":", 7);
    o = put_u64(o + 7, seq);
    memcpy(o, ",\"ts\":", 6);
    o = put_u64(o + 6, ts);
    link_hash(prev, start, o - start, d);
    memcpy(o, ",\"h\":\"", 6);
    o += 6;
    to_hex(d, o);
    o += 64;
    memcpy(o, "\"}\n", 3);
    return (o + 3) - start;
}

/*
 * chain_append(buf: bytearray, body: bytes, prev: bytes, seq: int, ts: int) -> (h: bytes, hex: bytes)
 *
 * One line of the chain onto the end of buf: body (an event's canonical encoding, "{...}") without its '}', then
 * ,"seq":SEQ,"ts":TS, then ,"h":"HEX"} and a newline, where h = SHA-256(tag 0x00 || prev || the line before
 * ,"h"). What the writer's append did in five Python steps, in one: the line is written into buf where it stays.
 */
static PyObject *chain_append(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyByteArray_Check(args[0]) || !PyBytes_Check(args[1]) || !PyBytes_Check(args[2]) ||
        PyBytes_GET_SIZE(args[2]) != 32) {
        PyErr_SetString(PyExc_TypeError, "chain_append(buf: bytearray, body: bytes, prev: 32 bytes, seq, ts)");
        return NULL;
    }
    Py_ssize_t blen = PyBytes_GET_SIZE(args[1]);
    const char *body = PyBytes_AS_STRING(args[1]);
    if (blen < 2 || body[blen - 1] != '}') {
        PyErr_SetString(PyExc_ValueError, "chain_append: body is not an encoded event");
        return NULL;
    }
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[3]), ts;
    if (seq == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    ts = PyLong_AsUnsignedLongLong(args[4]);
    if (ts == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    PyObject *buf = args[0];
    Py_ssize_t at = PyByteArray_GET_SIZE(buf);
    if (PyByteArray_Resize(buf, at + blen - 1 + CHAIN_ROOM) < 0)
        return NULL;
    char *start = PyByteArray_AS_STRING(buf) + at;
    memcpy(start, body, (size_t)(blen - 1));
    unsigned char d[32];
    Py_ssize_t n = chain_line(start, blen, (const unsigned char *)PyBytes_AS_STRING(args[2]), seq, ts, d);
    if (PyByteArray_Resize(buf, at + n) < 0)
        return NULL;
    PyObject *h = PyBytes_FromStringAndSize((const char *)d, 32);
    PyObject *hx = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(buf) + at + n - 67, 64);
    if (h == NULL || hx == NULL) {
        Py_XDECREF(h);
        Py_XDECREF(hx);
        return NULL;
    }
    return Py_BuildValue("(NN)", h, hx);
}

/*
 * scalars_ok(obj, offsets: bytes, kinds: bytes) -> bool
 *
 * Whether every field of a struct whose fields are all ints and floats (offsets: their slots, Py_ssize_t each;
 * kinds: 'i' an int, 'I' an int or None, 'f' an int or float, 'F' an int, float or None) holds exactly such a value:
 * an int (not a bool, not a subclass) within int64, or a finite float (exactly float). True means msgspec's
 * strict decode of its encoding would accept it as it is (the writer's check, without the decode); False only
 * sends the event the longer way, which decides.
 */
static int plain_scalars(PyObject *o, PyObject *offsets, PyObject *kinds_b)
{
    const Py_ssize_t *offs = (const Py_ssize_t *)PyBytes_AS_STRING(offsets);
    const char *kinds = PyBytes_AS_STRING(kinds_b);
    Py_ssize_t n = PyBytes_GET_SIZE(kinds_b);
    const char *obj = (const char *)o;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = *(PyObject *const *)(obj + offs[i]);
        char k = kinds[i];
        if (v == NULL)
            return 0;
        if (v == Py_None) {
            if (k == 'I' || k == 'F')
                continue;
            return 0;
        }
        if (PyLong_CheckExact(v)) {
            int over;
            PyLong_AsLongLongAndOverflow(v, &over);
            if (over)
                return 0;
            continue;
        }
        if ((k == 'f' || k == 'F') && PyFloat_CheckExact(v) && isfinite(PyFloat_AS_DOUBLE(v)))
            continue;
        return 0;
    }
    return 1;
}

static int scalar_args_ok(PyObject *offsets, PyObject *kinds)
{
    if (!PyBytes_Check(offsets) || !PyBytes_Check(kinds) ||
        PyBytes_GET_SIZE(offsets) != (Py_ssize_t)sizeof(Py_ssize_t) * PyBytes_GET_SIZE(kinds)) {
        PyErr_SetString(PyExc_TypeError, "offsets: bytes of Py_ssize_t, one a kind");
        return 0;
    }
    return 1;
}

static PyObject *scalars_ok(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !scalar_args_ok(args[1], args[2]))
        return NULL;
    return PyBool_FromLong(plain_scalars(args[0], args[1], args[2]));
}

/*
 * encode_scalars(encode, slow, offsets: bytes, kinds: bytes, obj) -> bytes
 *
 * encode(obj) when scalars_ok(obj, offsets, kinds), else slow(obj): the writer's encoder of a class of ints and
 * floats (a partial of the first four), one C call where a Python closure cost a frame.
 */
static PyObject *encode_scalars(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !scalar_args_ok(args[2], args[3]))
        return NULL;
    return PyObject_CallOneArg(plain_scalars(args[4], args[2], args[3]) ? args[0] : args[1], args[4]);
}

/* slot_offsets(cls, names: tuple[str, ...]) -> bytes | None: where each named field of cls lives (scalars_ok's
 * offsets), or None when one is not a plain slot. */
static PyObject *slot_offsets(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0]) || !PyTuple_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "slot_offsets(cls, names: tuple)");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(args[1]);
    PyObject *out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(Py_ssize_t));
    if (out == NULL)
        return NULL;
    Py_ssize_t *offs = (Py_ssize_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        offs[i] = slot_of((PyTypeObject *)args[0], PyTuple_GET_ITEM(args[1], i));
        if (offs[i] < 0) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
    }
    return out;
}

static PyMethodDef methods[] = {
    {"step_lines", (PyCFunction)(void (*)(void))step_lines, METH_FASTCALL,
     "Which lines of a block are canonical step_observed records but for their numbers' spelling, and the numbers."},
    {"line_hash", (PyCFunction)(void (*)(void))line_hash, METH_FASTCALL, "h[n] from h[n-1] (32 bytes) and P[n]."},
    {"chain_append", (PyCFunction)(void (*)(void))chain_append, METH_FASTCALL,
     "Chain an encoded event onto the end of a bytearray: (h, hex)."},
    {"scalars_ok", (PyCFunction)(void (*)(void))scalars_ok, METH_FASTCALL,
     "Whether a struct of ints and floats holds only int64 ints and finite floats (None where allowed)."},
    {"encode_scalars", (PyCFunction)(void (*)(void))encode_scalars, METH_FASTCALL,
     "encode(obj) if scalars_ok(obj, offsets, kinds) else slow(obj)."},
    {"slot_offsets", (PyCFunction)(void (*)(void))slot_offsets, METH_FASTCALL,
     "The slots of a class's named fields, or None."},
    {"check_lines", (PyCFunction)(void (*)(void))check_lines, METH_FASTCALL,
     "Index of the first line whose seq, hash suffix or chain hash is wrong, or -1."},
    {"sha_ni", (PyCFunction)(void (*)(void))sha_ni, METH_FASTCALL,
     "Whether batch hashing uses the x86 SHA extensions; sha_ni(on) switches it where the CPU has them."},
    {"scan_block", (PyCFunction)(void (*)(void))scan_block, METH_FASTCALL,
     "check_lines over a block of complete lines, unsplit: (bad index or -1, newline offsets, last hash, leaves)."},
    {"leaf_range", (PyCFunction)(void (*)(void))leaf_range, METH_FASTCALL,
     "The compact range (height, hash) of the leaves of these lines, starting at leaf index begin."},
    {"block_range", (PyCFunction)(void (*)(void))block_range, METH_FASTCALL,
     "leaf_range of the whole lines of buf[start:], as they lie in the buffer."},
    {"hash_range", (PyCFunction)(void (*)(void))hash_range, METH_FASTCALL,
     "leaf_range for leaves given as their hashes (32 bytes each, concatenated)."},
    {"range_merge", (PyCFunction)(void (*)(void))range_merge, METH_FASTCALL,
     "CompactRange.merge on node lists, in place: returns the new end."},
    {"range_root", (PyCFunction)(void (*)(void))range_root, METH_FASTCALL, "The root of a compact range from 0."},
    {"leaf_hashes", (PyCFunction)(void (*)(void))leaf_hashes, METH_FASTCALL, "Leaf hashes, concatenated."},
    {"node_level", (PyCFunction)(void (*)(void))node_level, METH_FASTCALL, "Node hashes of consecutive pairs."},
    {"join_lines", (PyCFunction)(void (*)(void))join_lines, METH_FASTCALL,
     "The lines of segments of blocks as one Arrow binary column's buffers: (data, offsets, wide)."},
    {"step_records", (PyCFunction)(void (*)(void))step_records, METH_FASTCALL,
     "The records of a block's step lines, built from the lines and their numbers without decoding them again."},
    {"type_run", (PyCFunction)(void (*)(void))type_run, METH_FASTCALL,
     "The end of the run of list items of exactly one type."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "trainledger.journal._fast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fast(void)
{
    hex_table();
    for (int f = 0; f < 14; f++)
        if (!(S_fields[f] = PyUnicode_InternFromString(FIELD_NAMES[f])))
            return NULL;
#ifdef HAVE_SHANI_CODE
    use_shani = shani_usable();
#endif
    return PyModule_Create(&module);
}
