/*
 * Optional accelerator for the hash chain (format v1, docs/FORMAT.md section 3).
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

static PyMethodDef methods[] = {
    {"line_hash", (PyCFunction)(void (*)(void))line_hash, METH_FASTCALL, "h[n] from h[n-1] (32 bytes) and P[n]."},
    {"check_lines", (PyCFunction)(void (*)(void))check_lines, METH_FASTCALL,
     "Index of the first line whose seq, hash suffix or chain hash is wrong, or -1."},
    {"leaf_range", (PyCFunction)(void (*)(void))leaf_range, METH_FASTCALL,
     "The compact range (height, hash) of the leaves of these lines, starting at leaf index begin."},
    {"leaf_hashes", (PyCFunction)(void (*)(void))leaf_hashes, METH_FASTCALL, "Leaf hashes, concatenated."},
    {"node_level", (PyCFunction)(void (*)(void))node_level, METH_FASTCALL, "Node hashes of consecutive pairs."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "journal._chainfast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chainfast(void) { return PyModule_Create(&module); }
