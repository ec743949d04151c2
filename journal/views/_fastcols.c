/*
 * The views' optional accelerator (journal/views/parquet/export.py loads it through journal/accel.py): a block's
 * step lines as Arrow columns, checked by the same template as the verifier's (step_columns), and records' fields
 * as Arrow column buffers (record_column, record_columns). Held to its Python twin by
 * tests/unit/journal/test_export_columns.py and built under sanitizers by tests/integration/journal/test_sanitizers.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX: fields read from their slots */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../_slots.h"
#include "../_steplines.h"

/*
 * step_columns(block, ends: bytes) -> (mask, numbers, at, data, valid, ts, h, k) | None
 *
 * step_lines' check of a block's lines (mask and numbers as mode 0 gives them: numbers holds the ones number_read
 * cannot settle, "[n1,...]", for the caller's msgspec decode and re-encode), and instead of values for records, the
 * step lines' fields as columns: k step lines; data (a bytearray) holds column c of step line r at slot c * n + r
 * (n: the block's lines), an int64 for step, examples, tokens and supervised_tokens, a double for the other
 * fields (an int there as the nearest double, as a cast to DOUBLE makes it); valid (a bytearray) 1 at the same
 * index where the line has the field; at (uint32 each) the slots of the numbers in numbers, in order, for the
 * caller to write their values in. ts (int64) and h (64 characters) of every line of the block, from the tail
 * scan_block held. None where a line's ts is past int64: the caller takes the records' way.
 */
static PyObject *step_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyBytes_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "step_columns(block, ends: bytes)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const char *s = (const char *)view.buf;
    Py_ssize_t len = view.len, n = PyBytes_GET_SIZE(args[1]) / 4, o = 1, count = 0, start = 0, k = 0, nat = 0;
    const uint32_t *e = (const uint32_t *)PyBytes_AS_STRING(args[1]);
    PyObject *mask = PyBytes_FromStringAndSize(NULL, n), *nums = PyBytes_FromStringAndSize(NULL, len + 2),
             *at = PyBytes_FromStringAndSize(NULL, 4 * 10 * n),
             *data = PyByteArray_FromStringAndSize(NULL, 8 * STEP_COLUMNS * n),
             *valid = PyByteArray_FromStringAndSize(NULL, STEP_COLUMNS * n),
             *ts = PyBytes_FromStringAndSize(NULL, 8 * n), *h = PyBytes_FromStringAndSize(NULL, 64 * n), *out = NULL;
    if (mask == NULL || nums == NULL || at == NULL || data == NULL || valid == NULL || ts == NULL || h == NULL)
        goto done;
    char *m = PyBytes_AS_STRING(mask), *numbers = PyBytes_AS_STRING(nums), *hex = PyBytes_AS_STRING(h);
    unsigned char *ok = (unsigned char *)PyByteArray_AS_STRING(valid);
    uint32_t *where = (uint32_t *)PyBytes_AS_STRING(at);
    long long *iv = (long long *)PyByteArray_AS_STRING(data), *tv = (long long *)PyBytes_AS_STRING(ts);
    double *dv = (double *)PyByteArray_AS_STRING(data);
    line_numbers got;
    memset(ok, 0, (size_t)(STEP_COLUMNS * n));
    memset(dv, 0, (size_t)(8 * STEP_COLUMNS * n)); /* a cell a line lacks reads as 0 */
    numbers[0] = '[';
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t stop = (Py_ssize_t)e[i], r;
        if (stop >= len || stop < start || stop - start < SUFFIX + 16) {
            PyErr_SetString(PyExc_ValueError, "step_columns: ends do not fit the block");
            goto done;
        }
        const char *line = s + start;
        if (!line_ts(line, stop - start, &tv[i])) {
            out = Py_NewRef(Py_None);
            goto done;
        }
        memcpy(hex + 64 * i, s + stop - 66, 64);
        m[i] = (char)step_line(line, s + stop, numbers, &o, &count, 0, &got);
        start = stop + 1;
        if (!m[i])
            continue;
        r = k++;
        iv[r] = got.step;
        ok[r] = 1;
        for (int g = 0; g < got.n; g++) {
            Py_ssize_t slot = (got.v[g].f + 1) * n + r;
            ok[slot] = 1;
            if (!got.v[g].proven)
                where[nat++] = (uint32_t)slot;
            else
                dv[slot] = got.v[g].is_int ? (double)got.v[g].iv : got.v[g].x; /* an int: the nearest double */
        }
        for (int f = 0; f < STEP_COLUMNS - 1; f++)
            if (STEP_FIELDS[f].type == 'i' && (got.present >> f & 1)) {
                iv[(f + 1) * n + r] = got.ints[f];
                ok[(f + 1) * n + r] = 1;
            }
    }
    numbers[o++] = ']';
    if (_PyBytes_Resize(&nums, o) < 0 || _PyBytes_Resize(&at, 4 * nat) < 0)
        goto done;
    out = Py_BuildValue("(OOOOOOOn)", mask, nums, at, data, valid, ts, h, k);
done:
    PyBuffer_Release(&view);
    Py_XDECREF(mask);
    Py_XDECREF(nums);
    Py_XDECREF(at);
    Py_XDECREF(data);
    Py_XDECREF(valid);
    Py_XDECREF(ts);
    Py_XDECREF(h);
    return out;
}

/* record_column(records, name, code) -> (data, validity or None, nulls) or None: one field of records (of one
 * type) as an Arrow column's buffers. code 'd': float or None (float64); 'q': int within int64 or None (int64);
 * 'b': bool or None (bit-packed). None when a value is anything else (an int in a float field, an int beyond
 * int64): the caller builds that column the ordinary way. */
/* One column of record_columns: where its field lives, its buffers as they fill, and whether a value did not fit
 * (the column then comes back None). */
typedef struct {
    PyObject *name, *data, *valid;
    Py_ssize_t off, nulls;
    Py_UCS4 code;
    char *d;
    unsigned char *vb;
    int other;
} column_fill;

/* Value v (a new reference, consumed) of record i into column c: 1, or 0 when it is not of the column's type. */
static int column_put(column_fill *c, Py_ssize_t i, PyObject *v)
{
    int ok = 1;
    if (v == Py_None) {
        c->nulls++;
        if (c->code != 'b')
            memset(c->d + i * 8, 0, 8);
    } else {
        c->vb[i >> 3] |= (unsigned char)(1u << (i & 7));
        if (c->code == 'd') {
            if (PyFloat_CheckExact(v)) {
                double x = PyFloat_AS_DOUBLE(v);
                memcpy(c->d + i * 8, &x, 8);
            } else
                ok = 0;
        } else if (c->code == 'q') {
            int overflow = 0;
            long long x = PyLong_CheckExact(v) ? PyLong_AsLongLongAndOverflow(v, &overflow) : 0;
            if (PyLong_CheckExact(v) && !overflow)
                memcpy(c->d + i * 8, &x, 8);
            else
                ok = 0;
        } else if (v == Py_True || v == Py_False) {
            if (v == Py_True)
                ((unsigned char *)c->d)[i >> 3] |= (unsigned char)(1u << (i & 7));
        } else
            ok = 0;
    }
    Py_DECREF(v);
    return ok;
}

/* The columns' buffers filled from records, one pass over them (each record visited once for all its fields): a
 * list of (data, validity or None, nulls), None for a column a value did not fit; NULL on error. */
static PyObject *fill_columns(PyObject *recs, column_fill *cols, Py_ssize_t k)
{
    Py_ssize_t n = PyList_GET_SIZE(recs), c, i;
    PyTypeObject *t = n ? Py_TYPE(PyList_GET_ITEM(recs, 0)) : NULL;
    PyObject *out = NULL;
    Py_ssize_t vbytes = (n + 7) / 8;
    for (c = 0; c < k; c++) {
        column_fill *f = &cols[c];
        f->off = t ? slot_of(t, f->name) : -1;
        if (f->off >= 0 && (f->off < (Py_ssize_t)sizeof(PyObject)
                            || f->off > t->tp_basicsize - (Py_ssize_t)sizeof(PyObject *)))
            f->off = -1;
        Py_ssize_t width = f->code == 'b' ? vbytes : n * 8;
        f->data = PyBytes_FromStringAndSize(NULL, width);
        f->valid = PyBytes_FromStringAndSize(NULL, vbytes);
        if (f->data == NULL || f->valid == NULL)
            goto done;
        f->d = PyBytes_AS_STRING(f->data);
        f->vb = (unsigned char *)PyBytes_AS_STRING(f->valid);
        memset(f->vb, 0, (size_t)vbytes);
        if (f->code == 'b')
            memset(f->d, 0, (size_t)width);
    }
    for (i = 0; i < n; i++) {
        PyObject *ev = PyList_GET_ITEM(recs, i);
        for (c = 0; c < k; c++) {
            column_fill *f = &cols[c];
            PyObject *v;
            if (f->other)
                continue;
            if (f->off >= 0 && Py_TYPE(ev) == t) {
                v = *(PyObject **)((char *)ev + f->off);
                if (v == NULL) {
                    f->other = 1;
                    continue;
                }
                Py_INCREF(v);
            } else if ((v = PyObject_GetAttr(ev, f->name)) == NULL)
                goto done;
            if (!column_put(f, i, v))
                f->other = 1;
        }
    }
    out = PyList_New(k);
    if (out == NULL)
        goto done;
    for (c = 0; c < k; c++) {
        column_fill *f = &cols[c];
        PyObject *item;
        if (f->other)
            item = Py_NewRef(Py_None);
        else {
            if (f->nulls == 0)
                Py_SETREF(f->valid, Py_NewRef(Py_None));
            item = Py_BuildValue("(OOn)", f->data, f->valid, f->nulls);
            if (item == NULL) {
                Py_CLEAR(out);
                goto done;
            }
        }
        PyList_SET_ITEM(out, c, item);
    }
done:
    for (c = 0; c < k; c++) {
        Py_CLEAR(cols[c].data);
        Py_CLEAR(cols[c].valid);
    }
    return out;
}

/* A column's code ('d', 'q' or 'b', one character) as column_fill takes it; 0 with ValueError else. */
static Py_UCS4 column_code(PyObject *code)
{
    Py_UCS4 c = PyUnicode_Check(code) && PyUnicode_GetLength(code) == 1 ? PyUnicode_READ_CHAR(code, 0) : 0;
    if (c != 'd' && c != 'q' && c != 'b') {
        PyErr_SetString(PyExc_ValueError, "a column's code is 'd', 'q' or 'b'");
        return 0;
    }
    return c;
}

static PyObject *record_column(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyUnicode_Check(args[1]) || !PyUnicode_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "record_column(records: list, name: str, code: str)");
        return NULL;
    }
    column_fill col = {args[1], NULL, NULL, -1, 0, column_code(args[2]), NULL, NULL, 0};
    if (col.code == 0)
        return NULL;
    PyObject *got = fill_columns(args[0], &col, 1);
    if (got == NULL)
        return NULL;
    PyObject *one = Py_NewRef(PyList_GET_ITEM(got, 0));
    Py_DECREF(got);
    return one;
}

/* record_columns(records, names: tuple[str, ...], codes: tuple[str, ...]) -> list: record_column of each name
 * and code, in one pass over the records (each visited once for all its fields, not once a column). */
static PyObject *record_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyTuple_CheckExact(args[1]) || !PyTuple_CheckExact(args[2])
            || PyTuple_GET_SIZE(args[1]) != PyTuple_GET_SIZE(args[2])) {
        PyErr_SetString(PyExc_TypeError, "record_columns(records: list, names: tuple, codes: tuple of one length)");
        return NULL;
    }
    Py_ssize_t k = PyTuple_GET_SIZE(args[1]);
    column_fill *cols = PyMem_Calloc((size_t)(k ? k : 1), sizeof(column_fill));
    if (cols == NULL)
        return PyErr_NoMemory();
    PyObject *out = NULL;
    for (Py_ssize_t c = 0; c < k; c++) {
        cols[c].name = PyTuple_GET_ITEM(args[1], c);
        if (!PyUnicode_Check(cols[c].name)) {
            PyErr_SetString(PyExc_TypeError, "record_columns: a name is a str");
            goto done;
        }
        if ((cols[c].code = column_code(PyTuple_GET_ITEM(args[2], c))) == 0)
            goto done;
    }
    out = fill_columns(args[0], cols, k);
done:
    PyMem_Free(cols);
    return out;
}

static PyMethodDef methods[] = {
    {"step_columns", (PyCFunction)(void (*)(void))step_columns, METH_FASTCALL,
     "step_lines' check of a block, and its step lines' fields as columns (the ts and h of every line)."},
    {"record_columns", (PyCFunction)(void (*)(void))record_columns, METH_FASTCALL,
     "record_columns(records, names, codes) -> list: record_column of each, in one pass over the records"},
    {"record_column", (PyCFunction)(void (*)(void))record_column, METH_FASTCALL,
     "One float, int64 or bool field of records of one type as an Arrow column's buffers, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "trainledger.journal.views._fastcols", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastcols(void)
{
    return PyModule_Create(&module);
}
