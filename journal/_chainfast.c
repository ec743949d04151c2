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
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

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

static int unhex_lower(const char *s, unsigned char *out)
{
    for (int i = 0; i < 32; i++) {
        int v = 0;
        for (int k = 0; k < 2; k++) {
            char ch = s[2 * i + k];
            int d;
            if (ch >= '0' && ch <= '9') d = ch - '0';
            else if (ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
            else return 0;
            v = (v << 4) | d;
        }
        out[i] = (unsigned char)v;
    }
    return 1;
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

/*
 * chain_check(prev: bytes, lines: list[bytes]) -> int
 *
 * Each line (no newline) must end with ,"h":"<64 lowercase hex>"} holding the
 * h computed from the previous line's stored hash (prev for the first).
 * Returns the index of the first line that fails, or -1 when all hold.
 */
static PyObject *chain_check(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[0]) || PyBytes_GET_SIZE(args[0]) != 32 || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "chain_check(prev: 32 bytes, lines: list[bytes])");
        return NULL;
    }
    unsigned char prev[32], stored[32], got[32];
    memcpy(prev, PyBytes_AS_STRING(args[0]), 32);
    PyObject *lines = args[1];
    Py_ssize_t n = PyList_GET_SIZE(lines);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *line = PyList_GET_ITEM(lines, i);
        if (!PyBytes_Check(line)) {
            PyErr_SetString(PyExc_TypeError, "chain_check: lines must be bytes");
            return NULL;
        }
        const char *s = PyBytes_AS_STRING(line);
        Py_ssize_t len = PyBytes_GET_SIZE(line);
        if (len < SUFFIX || memcmp(s + len - SUFFIX, ",\"h\":\"", 6) != 0 || s[len - 2] != '"' ||
            s[len - 1] != '}' || !unhex_lower(s + len - 66, stored))
            return PyLong_FromSsize_t(i);
        link_hash(prev, s, len - SUFFIX, got);
        if (memcmp(got, stored, 32) != 0)
            return PyLong_FromSsize_t(i);
        memcpy(prev, stored, 32);
    }
    return PyLong_FromLong(-1);
}

static PyMethodDef methods[] = {
    {"line_hash", (PyCFunction)(void (*)(void))line_hash, METH_FASTCALL, "h[n] from h[n-1] (32 bytes) and P[n]."},
    {"chain_check", (PyCFunction)(void (*)(void))chain_check, METH_FASTCALL,
     "Index of the first line whose stored hash does not follow, or -1."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "journal._chainfast", NULL, -1, methods};

PyMODINIT_FUNC PyInit__chainfast(void) { return PyModule_Create(&module); }
