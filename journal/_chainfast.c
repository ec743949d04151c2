/*
 * Optional accelerator for the hash chain (format v1, docs/FORMAT.md section 3), the Merkle tree's leaves and
 * nodes (section 4.1), and the health detectors' common step (journal/health.py).
 *
 *   h[n] = SHA-256("trainledger/v1/line" 0x00 || h[n-1] || P[n])
 *
 * Python's hashlib builds an OpenSSL EVP object per hash, which costs more than
 * hashing a 250-byte line; here the same OpenSSL SHA-256 runs on a stack
 * context. journal/_accel.py falls back to hashlib when this module was not
 * built, and the tests check both paths agree.
 */
#define _GNU_SOURCE /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>
#include <math.h>
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
    char hex[64];
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
        if (len < SUFFIX + 16 || memcmp(s + len - SUFFIX, ",\"h\":\"", 6) != 0 || s[len - 2] != '"' ||
            s[len - 1] != '}')
            return PyLong_FromSsize_t(i);
        long long ts, seq;
        Py_ssize_t a = digits_before(s, len - SUFFIX, &ts);
        if (a < 6 || memcmp(s + a - 6, ",\"ts\":", 6) != 0)
            return PyLong_FromSsize_t(i);
        Py_ssize_t b = digits_before(s, a - 6, &seq);
        if (b < 7 || memcmp(s + b - 7, ",\"seq\":", 7) != 0 || seq != first_seq + i)
            return PyLong_FromSsize_t(i);
        if (memmem(s, (size_t)len, boundary, sizeof boundary - 1) != NULL)
            return PyLong_FromSsize_t(i);
        /* Compare in hex: equality also proves the stored text is lowercase hex. */
        link_hash(prev, s, len - SUFFIX, prev);
        to_hex(prev, hex);
        if (memcmp(hex, s + len - 66, 64) != 0)
            return PyLong_FromSsize_t(i);
    }
    return PyLong_FromLong(-1);
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
    int heights[160];
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
        if (top == 160) { /* cannot happen: a range holds at most 2 * 64 subtrees */
            PyErr_SetString(PyExc_OverflowError, "leaf_range: range too large");
            return NULL;
        }
        heights[top] = h;
        memcpy(hashes[top], cur, 32);
        top++;
    }
    PyObject *out = PyList_New(top);
    if (out == NULL)
        return NULL;
    for (int k = 0; k < top; k++) {
        PyObject *t = Py_BuildValue("(iy#)", heights[k], (const char *)hashes[k], (Py_ssize_t)32);
        if (t == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k, t);
    }
    return out;
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

/*
 * baseline_step(sorted, values, steps, x, step, min_periods, inv_scale, window) -> bool
 *
 * The health detector's common step (journal/health.py, _Detector.score with no candidate pending), the same
 * arithmetic in the same order: with at least min_periods values in the window, x above the median and the
 * window's MAD possibly below (x - median) * inv_scale (the count of values within that distance of the median,
 * widened by one ulp each way, reaching half the window), return False and change nothing: the caller scores x
 * the long way. Otherwise add x to the baseline (step to steps, x to values, x into sorted after equal values,
 * and the value that left the window out of sorted) and return True. Any list item that is not a float also
 * returns False, unchanged: the caller's code is the reference and handles every case.
 */
static int float_at(PyObject *list, Py_ssize_t i, double *v)
{
    PyObject *o = PyList_GET_ITEM(list, i);
    if (!PyFloat_CheckExact(o))
        return 0;
    *v = PyFloat_AS_DOUBLE(o);
    return 1;
}

/* bisect: the first index whose item is >= v (left) or > v (right); -1 when an item is not a float. */
static Py_ssize_t bisect_floats(PyObject *s, double v, int right)
{
    Py_ssize_t lo = 0, hi = PyList_GET_SIZE(s);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        double m;
        if (!float_at(s, mid, &m))
            return -1;
        if (right ? v < m : !(m < v))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

static PyObject *baseline_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) || !PyList_CheckExact(args[2])
            || !PyLong_Check(args[4]) || !PyLong_Check(args[5])
            || !PyFloat_Check(args[6]) || !PyLong_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "baseline_step(sorted: list, values: list, steps: list, x: float, step: int, "
                                         "min_periods: int, inv_scale: float, window: int)");
        return NULL;
    }
    PyObject *s = args[0], *values = args[1], *steps = args[2], *xo = args[3];
    if (!PyFloat_CheckExact(xo))
        Py_RETURN_FALSE;
    double x = PyFloat_AS_DOUBLE(xo), inv_scale = PyFloat_AS_DOUBLE(args[6]);
    Py_ssize_t min_periods = PyLong_AsSsize_t(args[5]), window = PyLong_AsSsize_t(args[7]);
    if ((min_periods == -1 || window == -1) && PyErr_Occurred())
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(s);
    if (n >= min_periods) {
        if (n == 0)
            Py_RETURN_FALSE;
        Py_ssize_t h = n >> 1;
        double a, b, med;
        if (n & 1) {
            if (!float_at(s, h, &med))
                Py_RETURN_FALSE;
        } else {
            if (!float_at(s, h - 1, &a) || !float_at(s, h, &b))
                Py_RETURN_FALSE;
            med = 0.5 * (a + b);
        }
        if (x > med) {
            double d = (x - med) * inv_scale;
            Py_ssize_t hi = bisect_floats(s, nextafter(med + d, INFINITY), 0);
            Py_ssize_t lo = bisect_floats(s, nextafter(med - d, -INFINITY), 1);
            if (hi < 0 || lo < 0 || hi - lo >= h)
                Py_RETURN_FALSE;
        }
    }
    if (window < 1)
        Py_RETURN_FALSE;
    /* Everything is read before anything changes. x goes in after the values equal to it; then the value that
     * leaves the window (values[-window - 1] once x is appended) goes out of sorted at its first place there:
     * the count of values below it, x among them when x is smaller. */
    Py_ssize_t at = bisect_floats(s, x, 1);
    if (at < 0)
        Py_RETURN_FALSE;
    Py_ssize_t nv = PyList_GET_SIZE(values), out = -1;
    if (nv + 1 > window) {
        double old;  /* values[nv - window]: an index in [0, nv) since 1 <= window <= nv */
        if (!float_at(values, nv - window, &old))
            Py_RETURN_FALSE;
        out = bisect_floats(s, old, 0);
        if (out < 0)
            Py_RETURN_FALSE;
        out += x < old;
    }
    if (PyList_Append(steps, args[4]) < 0)
        return NULL;
    if (PyList_Append(values, xo) < 0 || PyList_Insert(s, at, xo) < 0)
        return NULL;  /* out of memory: the lists are no longer consistent, and the error propagates */
    if (out >= 0 && PyList_SetSlice(s, out, out + 1, NULL) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"line_hash", (PyCFunction)(void (*)(void))line_hash, METH_FASTCALL, "h[n] from h[n-1] (32 bytes) and P[n]."},
    {"check_lines", (PyCFunction)(void (*)(void))check_lines, METH_FASTCALL,
     "Index of the first line whose seq, hash suffix or chain hash is wrong, or -1."},
    {"leaf_range", (PyCFunction)(void (*)(void))leaf_range, METH_FASTCALL,
     "The compact range (height, hash) of the leaves of these lines, starting at leaf index begin."},
    {"leaf_hashes", (PyCFunction)(void (*)(void))leaf_hashes, METH_FASTCALL, "Leaf hashes, concatenated."},
    {"node_level", (PyCFunction)(void (*)(void))node_level, METH_FASTCALL, "Node hashes of consecutive pairs."},
    {"baseline_step", (PyCFunction)(void (*)(void))baseline_step, METH_FASTCALL,
     "The health detector's common step: add x to the baseline (True), or leave it to the caller (False)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "journal._chainfast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chainfast(void) { return PyModule_Create(&module); }
