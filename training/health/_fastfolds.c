/*
 * The health folds' optional accelerator (training/health/detectors.py loads it through journal/accel.py): the
 * detectors' common step (baseline_step) and HealthProjection's fold over a run of common step records
 * (health_run), in the same arithmetic order as their Python lines (built with -ffp-contract=off). Held to them by
 * tests/unit/training/test_fold_steps.py and tests/unit/journal/test_accel.py, and built under sanitizers by
 * tests/integration/journal/test_sanitizers.py.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX: fields read from their slots */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../journal/_slots.h"

static PyObject *S_step, *S_loss, *S_grad_norm, *S_step_time_s, *S_tokens, *S_examples, *S_batch_fingerprint;

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

/* A detector's sorted window as the common step reads it: the list itself, or (health_run) its values mirrored in a
 * C array for the run (v non-NULL: n values, room for cap), which every change to the list also makes. */
typedef struct {
    PyObject *list;
    double *v;
    Py_ssize_t n, cap;
} sorted_win;

/* The i-th value of the window (0 when a list item is not a float). */
static inline int win_at(const sorted_win *w, Py_ssize_t i, double *x)
{
    if (w->v != NULL) {
        *x = w->v[i];
        return 1;
    }
    return float_at(w->list, i, x);
}

static inline Py_ssize_t win_len(const sorted_win *w)
{
    return w->v != NULL ? w->n : PyList_GET_SIZE(w->list);
}

/* bisect: the first index whose item is >= v (left) or > v (right); -1 when an item is not a float. */
static Py_ssize_t bisect_floats(const sorted_win *s, double v, int right)
{
    if (s->v != NULL && s->n > 0) {
        /* Without branches: the mirror holds no NaN, so every probe order finds the same place as the list's. */
        const double *base = s->v;
        Py_ssize_t len = s->n;
        if (right) {
            while (len > 1) {
                Py_ssize_t half = len >> 1;
                base = v < base[half] ? base : base + half;
                len -= half;
            }
            return (base - s->v) + !(v < base[0]);
        }
        while (len > 1) {
            Py_ssize_t half = len >> 1;
            base = base[half] < v ? base + half : base;
            len -= half;
        }
        return (base - s->v) + (base[0] < v);
    }
    Py_ssize_t lo = 0, hi = win_len(s);
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        double m;
        if (!win_at(s, mid, &m))
            return -1;
        if (right ? v < m : !(m < v))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* The median of sorted window s of n > 0 floats (as training/health/detectors.py's _sorted_median computes it); 0
 * when an item read is not a float. */
static int sorted_median(const sorted_win *s, Py_ssize_t n, double *med)
{
    Py_ssize_t h = n >> 1;
    double a, b;
    if (n & 1)
        return win_at(s, h, med);
    if (!win_at(s, h - 1, &a) || !win_at(s, h, &b))
        return 0;
    *med = 0.5 * (a + b);
    return 1;
}

/* The common step, in two halves: baseline_plan reads (and changes nothing): 1 with where x goes in sorted (*at)
 * and where the value leaving the window comes out (*out, -1 when none), or 0 for "the caller scores x the long
 * way" (warm, above the median, and the MAD possibly below (x - median) * inv_scale: the count of values within
 * that distance of the median, widened by one ulp each way, reaching half the window) and for any list item that is
 * not a float. baseline_commit then adds x (and step) and drops the value that left; -1 only when out of memory. */
static int baseline_plan(const sorted_win *s, PyObject *values, double x, Py_ssize_t min_periods, double inv_scale,
                         Py_ssize_t window, Py_ssize_t *at, Py_ssize_t *out)
{
    Py_ssize_t n = win_len(s);
    if (n >= min_periods) {
        Py_ssize_t h = n >> 1;
        double med;
        if (n == 0 || !sorted_median(s, n, &med))
            return 0;
        if (x > med) {
            double d = (x - med) * inv_scale;
            Py_ssize_t hi = bisect_floats(s, nextafter(med + d, INFINITY), 0);
            Py_ssize_t lo = bisect_floats(s, nextafter(med - d, -INFINITY), 1);
            if (hi < 0 || lo < 0 || hi - lo >= h)
                return 0;
        }
    }
    if (window < 1)
        return 0;
    /* x goes in after the values equal to it; then the value that leaves the window (values[-window - 1] once x
     * is appended) goes out of sorted at its first place there: the count of values below it, x among them when
     * x is smaller. */
    *at = bisect_floats(s, x, 1);
    if (*at < 0)
        return 0;
    Py_ssize_t nv = PyList_GET_SIZE(values);
    *out = -1;
    if (nv + 1 <= window && s->v != NULL && s->n >= s->cap)
        return 0;  /* no room left in the mirror (never, as health_run sizes it): the caller's */
    if (nv + 1 > window) {
        double old;  /* values[nv - window]: an index in [0, nv) since 1 <= window <= nv */
        if (!float_at(values, nv - window, &old))
            return 0;
        *out = bisect_floats(s, old, 0);
        /* the value leaving is where it would be: a window whose list and history disagree (nothing this code or
         * the Python detector makes) goes to the caller, which deletes what Python's bisect finds there */
        double there;
        if (*out < 0 || *out >= win_len(s) || !win_at(s, *out, &there) || there != old)
            return 0;
        *out += x < old;
    }
    return 1;
}

static int baseline_commit(sorted_win *w, PyObject *values, PyObject *steps, PyObject *xo, PyObject *step,
                           Py_ssize_t at, Py_ssize_t out)
{
    PyObject *s = w->list;
    double *v = w->v;
    if (PyList_Append(steps, step) < 0 || PyList_Append(values, xo) < 0)
        return -1;  /* out of memory: the lists are no longer consistent, and the error propagates */
    if (out < 0) {
        if (PyList_Insert(s, at, xo) < 0)
            return -1;
        if (v != NULL) {
            memmove(v + at + 1, v + at, (size_t)(w->n - at) * sizeof(double));
            v[at] = PyFloat_AS_DOUBLE(xo);
            w->n++;
        }
        return 0;
    }
    /* insort then the delete, as one move of the items between them (out != at: the value leaving is in the list,
     * so it sits before x when it is not above it, after x when it is) */
    PyObject **items = ((PyListObject *)s)->ob_item, *gone;
    if (out > at) {  /* out is in the list with x in it: the leaving value is items[out - 1] now */
        gone = items[out - 1];
        memmove(items + at + 1, items + at, (size_t)(out - 1 - at) * sizeof(PyObject *));
        items[at] = xo;
        if (v != NULL) {
            memmove(v + at + 1, v + at, (size_t)(out - 1 - at) * sizeof(double));
            v[at] = PyFloat_AS_DOUBLE(xo);
        }
    } else {
        gone = items[out];
        memmove(items + out, items + out + 1, (size_t)(at - 1 - out) * sizeof(PyObject *));
        items[at - 1] = xo;
        if (v != NULL) {
            memmove(v + out, v + out + 1, (size_t)(at - 1 - out) * sizeof(double));
            v[at - 1] = PyFloat_AS_DOUBLE(xo);
        }
    }
    Py_INCREF(xo);
    Py_DECREF(gone);
    return 0;
}

/*
 * baseline_step(sorted, values, steps, x, step, min_periods, inv_scale, window) -> bool
 *
 * The health detector's common step (training/health/detectors.py, _Detector.score with no candidate pending),
 * the same arithmetic in the same order: True when x was added to the baseline, False (nothing changed) when the
 * caller is to score x the long way. Any list item that is not a float also returns False, unchanged: the
 * caller's code is the reference and handles every case.
 */
static PyObject *baseline_step(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) || !PyList_CheckExact(args[2])
            || !PyLong_Check(args[4]) || !PyLong_Check(args[5])
            || !PyFloat_Check(args[6]) || !PyLong_Check(args[7])) {
        PyErr_SetString(PyExc_TypeError, "baseline_step(sorted: list, values: list, steps: list, x: float, step: int, "
                                         "min_periods: int, inv_scale: float, window: int)");
        return NULL;
    }
    if (!PyFloat_CheckExact(args[3]))
        Py_RETURN_FALSE;
    Py_ssize_t min_periods = PyLong_AsSsize_t(args[5]), window = PyLong_AsSsize_t(args[7]), at, out;
    if ((min_periods == -1 || window == -1) && PyErr_Occurred())
        return NULL;
    sorted_win w = {args[0], NULL, 0, 0};
    if (!baseline_plan(&w, args[1], PyFloat_AS_DOUBLE(args[3]), min_periods, PyFloat_AS_DOUBLE(args[6]), window,
                       &at, &out))
        Py_RETURN_FALSE;
    if (baseline_commit(&w, args[1], args[2], args[3], args[4], at, out) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* One detector as health_run takes it: (sorted, values, steps, min_periods, inv_scale, window, trim_at, log[, cap]).
 * cap (format 1.6's "range" rule): true when the rule is on; (log_ratio, power, z_thresh) to score
 * a value above the warm window's maximum here (range_plain), else such a value is not common (the caller scores
 * it). */
typedef struct {
    sorted_win sorted;  /* mirrored in a C array by mirror_window for the run */
    PyObject *values, *steps;
    Py_ssize_t min_periods, window, trim_at;
    double inv_scale;
    int log, cap;
    int rule; /* the range rule's parameters below were given */
    double log_ratio, power, z_thresh;
} detector;

static int detector_of(PyObject *t, detector *d)
{
    if (!PyTuple_CheckExact(t) || (PyTuple_GET_SIZE(t) != 8 && PyTuple_GET_SIZE(t) != 9)
            || !PyList_CheckExact(PyTuple_GET_ITEM(t, 0))
            || !PyList_CheckExact(PyTuple_GET_ITEM(t, 1)) || !PyList_CheckExact(PyTuple_GET_ITEM(t, 2))
            || !PyFloat_Check(PyTuple_GET_ITEM(t, 4))) {
        PyErr_SetString(PyExc_TypeError, "a detector is (sorted, values, steps, min_periods, inv_scale, window, "
                                         "trim_at, log[, cap])");
        return 0;
    }
    d->sorted = (sorted_win){PyTuple_GET_ITEM(t, 0), NULL, 0, 0};
    d->values = PyTuple_GET_ITEM(t, 1);
    d->steps = PyTuple_GET_ITEM(t, 2);
    d->min_periods = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 3));
    d->inv_scale = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(t, 4));
    d->window = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 5));
    d->trim_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 6));
    d->log = PyObject_IsTrue(PyTuple_GET_ITEM(t, 7));
    d->cap = PyTuple_GET_SIZE(t) == 9 ? PyObject_IsTrue(PyTuple_GET_ITEM(t, 8)) : 0;
    d->rule = 0;
    if (PyTuple_GET_SIZE(t) == 9 && PyTuple_CheckExact(PyTuple_GET_ITEM(t, 8))
            && PyTuple_GET_SIZE(PyTuple_GET_ITEM(t, 8)) == 3) {
        PyObject *r = PyTuple_GET_ITEM(t, 8);
        d->log_ratio = PyFloat_AsDouble(PyTuple_GET_ITEM(r, 0));
        d->power = PyFloat_AsDouble(PyTuple_GET_ITEM(r, 1));
        d->z_thresh = PyFloat_AsDouble(PyTuple_GET_ITEM(r, 2));
        d->rule = 1;
    }
    return !PyErr_Occurred() && d->log >= 0 && d->cap >= 0;
}

/* The detector's sorted window copied into a C array with room for what the run may add (at most up to the window,
 * at most one value a step): its bisects then read doubles in a row instead of a float object an item. 1 when
 * mirrored; 0 when an item is not a float, or is NaN (the window stays the list, read as before, the same probes as
 * Python's bisect: with a NaN in it, another order of probes could find another place); -1 when out of memory. */
static int mirror_window(detector *d, Py_ssize_t steps)
{
    sorted_win *w = &d->sorted;
    Py_ssize_t n = PyList_GET_SIZE(w->list), room = d->window > n ? d->window - n : 0;
    if (room > steps)
        room = steps;
    double *v = PyMem_Malloc((size_t)(n + room + 1) * sizeof(double));
    if (v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!float_at(w->list, i, &v[i]) || isnan(v[i])) {
            PyMem_Free(v);
            return 0;
        }
    w->v = v;
    w->n = n;
    w->cap = n + room + 1;
    return 1;
}

/* Above the warm window's maximum (format 1.6's "range" rule scores such a value in Python): 1, else 0; -1 when
 * the window's last item is not a float. */
static int above_cap(const detector *d, double x)
{
    Py_ssize_t n = win_len(&d->sorted);
    double top;
    if (!d->cap || n < d->min_periods || n == 0)
        return 0;
    if (!win_at(&d->sorted, n - 1, &top))
        return -1;
    return x > top;
}

/* training/health/detectors.py's _kth_deviation: the k-th smallest (0-based) of |s_i - m| over sorted s whose
 * median is m, the same comparisons in the same order; 0 (not read) when an item is not a float. */
static int kth_deviation(const sorted_win *s, double m, Py_ssize_t k, double *out)
{
    Py_ssize_t n = win_len(s), split = n / 2, a = split, b = n - split;
    Py_ssize_t lo = k + 1 - b > 0 ? k + 1 - b : 0, hi = k + 1 < a ? k + 1 : a;
    double x, y;
    while (lo < hi) {
        Py_ssize_t i = (lo + hi) / 2;
        if (!win_at(s, split - 1 - i, &x) || !win_at(s, split + (k - i), &y))
            return 0;
        if (m - x < y - m)
            lo = i + 1;
        else
            hi = i;
    }
    Py_ssize_t i = lo, j = k + 1 - lo;
    double da = -INFINITY, db = -INFINITY;
    if (i > 0) {
        if (!win_at(s, split - 1 - (i - 1), &x))
            return 0;
        da = m - x;
    }
    if (j > 0) {
        if (!win_at(s, split + (j - 1), &y))
            return 0;
        db = y - m;
    }
    *out = db > da ? db : da; /* Python's max(da, db): the first unless the second is greater */
    return 1;
}

/* Format 1.6's "range" rule (_Detector._score_range, no candidate pending) for a value x above the warm window's
 * maximum, when it ends as a plain step: not an excursion, its robust z not above the threshold. 1: x joins the
 * baseline as any value (the caller adds it); 0: the caller scores it the long way. The median, the MAD and z as the
 * Python lines compute them. A loss above joint_z is a joint candidate, which the projection's joint rule reads only
 * when the grad norm on the same step is above its own window's maximum too: health_run leaves that step to the
 * caller (both values up), so here, alone, it is a plain step (its raw statistics, which only that rule reads on that
 * same step, are not kept). */
static int range_plain(const detector *d, double x)
{
    const sorted_win *s = &d->sorted;
    Py_ssize_t n = win_len(s);
    double med, top, mad, a, b, z;
    if (!d->rule || n == 0 || !sorted_median(s, n, &med) || !win_at(s, n - 1, &top))
        return 0;
    if (n % 2) {
        if (!kth_deviation(s, med, n / 2, &mad))
            return 0;
    } else {
        if (!kth_deviation(s, med, n / 2 - 1, &a) || !kth_deviation(s, med, n / 2, &b))
            return 0;
        mad = 0.5 * (a + b);
    }
    z = mad > 0 ? (x - med) / (1.4826 * mad) : 0.0; /* MAD_SCALE */
    double e = d->power * (top - med), over = e > d->log_ratio ? e : d->log_ratio;
    if (x > top + over || z > d->z_thresh)
        return 0;
    return 1;
}

/* A field of a step record as a new reference: read from its slot (NULL, with AttributeError, when unset), or
 * by name. */
static PyObject *field(PyObject *ev, PyObject *name, Py_ssize_t off)
{
    if (off < 0)
        return PyObject_GetAttr(ev, name);
    PyObject *v = *(PyObject **)((char *)ev + off);
    if (v == NULL) {
        PyErr_SetObject(PyExc_AttributeError, name);
        return NULL;
    }
    Py_INCREF(v);
    return v;
}

/*
 * health_run(events, lo, hi, step_type, loss, grad, loss_log, fpt, peak, token_time_s, mfu_sum, mfu_min, mfu_max)
 *   -> (stop, last_step, tokens, token_time_s, mfu_sum, mfu_count, mfu_min, mfu_max, mfu_over, all_tokens,
 *       without_tokens, busy_ns, without_time)
 *
 * HealthProjection._step (training/health/detectors.py) for a run of events[lo:hi], as long as each is the common
 * case: a step_observed record (exactly step_type) with a finite float loss, a finite float grad norm or none, no
 * batch fingerprint, a token count that is an int (or neither tokens nor examples), a float step time or none, and
 * both detectors on their common step (baseline_plan) without reaching their trim point. The caller has checked
 * the state that makes a step common (no resume window open, no candidate pending, no spike episode open). It
 * stops at the first event that is not (stop: its index; nothing of it folded), for the caller's code, which is
 * the reference, to fold.
 *
 * The sums come back for the caller to store: the last step folded (None when none), the tokens of steps with a
 * step time (the MFU's), the running float sums continued in the same order as the Python code adds them, the MFU
 * count and count above 1, and for the compute totals every step's tokens and the steps without any, the sum of
 * every positive finite step time truncated to whole nanoseconds (ComputeTotals.add's int(s * 1e9): an integer sum,
 * the same in any grouping) and the steps without one. A step's MFU
 * is fpt * tokens / step_time_s / peak as Python computes it: the integer product rounded once to a double.
 */
static PyObject *health_fold(PyObject *const *args, PyObject *events, PyTypeObject *step_type, Py_ssize_t lo,
                             Py_ssize_t hi, int loss_log, detector dl, detector dg);

static PyObject *health_run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13 || !PyList_CheckExact(args[0]) || !PyType_Check(args[3]) || !PyFloat_Check(args[9])
            || !PyFloat_Check(args[10]) || !PyFloat_Check(args[11]) || !PyFloat_Check(args[12])) {
        PyErr_SetString(PyExc_TypeError, "health_run(events: list, lo, hi, step_type, loss, grad, loss_log, fpt, peak, "
                                         "token_time_s: float, mfu_sum: float, mfu_min: float, mfu_max: float)");
        return NULL;
    }
    PyObject *events = args[0];
    PyTypeObject *step_type = (PyTypeObject *)args[3];
    Py_ssize_t lo = PyLong_AsSsize_t(args[1]), hi = PyLong_AsSsize_t(args[2]);
    int loss_log = PyObject_IsTrue(args[6]);
    detector dl, dg;
    if (PyErr_Occurred() || loss_log < 0 || !detector_of(args[4], &dl) || !detector_of(args[5], &dg))
        return NULL;
    if (lo < 0 || hi > PyList_GET_SIZE(events) || lo > hi) {
        PyErr_SetString(PyExc_IndexError, "health_run: lo, hi out of range");
        return NULL;
    }
    PyObject *res = NULL;
    if (mirror_window(&dl, hi - lo) >= 0 && mirror_window(&dg, hi - lo) >= 0)
        res = health_fold(args, events, step_type, lo, hi, loss_log, dl, dg);
    PyMem_Free(dl.sorted.v);
    PyMem_Free(dg.sorted.v);
    return res;
}

/* health_run's fold, its arguments read and the windows mirrored. */
static PyObject *health_fold(PyObject *const *args, PyObject *events, PyTypeObject *step_type, Py_ssize_t lo,
                             Py_ssize_t hi, int loss_log, detector dl, detector dg)
{
    /* the MFU: both fpt (an int) and peak (a float) known, else no step has one */
    int mfu = args[7] != Py_None && args[8] != Py_None;
    long long fpt = 0;
    double peak = 0.0;
    if (mfu) {
        int over = 0;
        fpt = PyLong_Check(args[7]) ? PyLong_AsLongLongAndOverflow(args[7], &over) : -1;
        if (PyErr_Occurred())
            return NULL;
        if (over || !PyFloat_Check(args[8]) || fpt < 0)
            return Py_BuildValue("(nOLdddnddnLnLn)", lo, Py_None, 0LL, PyFloat_AS_DOUBLE(args[9]),
                                 PyFloat_AS_DOUBLE(args[10]), (Py_ssize_t)0, PyFloat_AS_DOUBLE(args[11]),
                                 PyFloat_AS_DOUBLE(args[12]), (Py_ssize_t)0, 0LL, (Py_ssize_t)0, 0LL, (Py_ssize_t)0);
        peak = PyFloat_AS_DOUBLE(args[8]);
    }
    double token_time = PyFloat_AS_DOUBLE(args[9]), mfu_sum = PyFloat_AS_DOUBLE(args[10]);
    double mfu_min = PyFloat_AS_DOUBLE(args[11]), mfu_max = PyFloat_AS_DOUBLE(args[12]);
    long long tokens = 0, all_tokens = 0, busy = 0;
    Py_ssize_t mfu_count = 0, mfu_over = 0, without = 0, without_time = 0, i;
    PyObject *last = NULL;  /* borrowed from the last event folded, which the list holds */
    Py_ssize_t o_step = slot_of(step_type, S_step), o_loss = slot_of(step_type, S_loss);
    Py_ssize_t o_grad = slot_of(step_type, S_grad_norm), o_st = slot_of(step_type, S_step_time_s);
    Py_ssize_t o_tk = slot_of(step_type, S_tokens), o_ex = slot_of(step_type, S_examples);
    Py_ssize_t o_fp = slot_of(step_type, S_batch_fingerprint);
    for (i = lo; i < hi; i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        if (Py_TYPE(ev) != step_type)
            break;
        PyObject *step = field(ev, S_step, o_step), *lo_ = field(ev, S_loss, o_loss);
        PyObject *g = field(ev, S_grad_norm, o_grad), *st = field(ev, S_step_time_s, o_st);
        PyObject *tk = field(ev, S_tokens, o_tk), *ex = field(ev, S_examples, o_ex);
        PyObject *fp = field(ev, S_batch_fingerprint, o_fp);
        PyObject *xl = NULL, *xg = NULL;
        int done = 0;  /* 1: folded; 0: not common (stop); -1: error */
        if (!step || !lo_ || !g || !st || !tk || !ex || !fp) {
            done = -1;
            goto next;
        }
        if (!PyLong_CheckExact(step) || !PyFloat_CheckExact(lo_) || fp != Py_None || (g != Py_None && !PyFloat_CheckExact(g))
                || (st != Py_None && !PyFloat_CheckExact(st)) || (tk == Py_None ? ex != Py_None : !PyLong_CheckExact(tk)))
            goto next;
        double loss = PyFloat_AS_DOUBLE(lo_);
        if (!isfinite(loss))
            goto next;
        /* the step's busy nanoseconds (0: no positive finite time); a time too long for 64 bits is Python's */
        long long ns = 0;
        if (st != Py_None) {
            double s = PyFloat_AS_DOUBLE(st);
            if (s > 0 && isfinite(s)) {
                if (!(s * 1e9 < 9.0e18))
                    goto next;
                ns = (long long)(s * 1e9);
                if (busy > LLONG_MAX - ns)
                    goto next;
            }
        }
        long long t = 0;
        if (tk != Py_None) {
            int over = 0;
            t = PyLong_AsLongLongAndOverflow(tk, &over);
            if (over || t < 0 || all_tokens > LLONG_MAX - t)
                goto next;
        }
        /* both detectors planned before either changes */
        Py_ssize_t at_l = 0, out_l = 0, at_g = 0, out_g = 0;
        int score_l = loss > 0 || !loss_log, score_g = 0;
        double vl = 0.0, vg = 0.0;
        /* a value above its window's maximum, scored here by the range rule when it ends as a plain step; both
         * detectors' values above theirs on one step is the joint rule's: the caller's */
        int up_l = 0, up_g = 0;
        if (score_l) {
            vl = dl.log ? log(loss) : loss;
            up_l = above_cap(&dl, vl);
            if (up_l < 0 || (up_l && !range_plain(&dl, vl)) || PyList_GET_SIZE(dl.values) + 1 >= dl.trim_at
                    || !baseline_plan(&dl.sorted, dl.values, vl, up_l ? PY_SSIZE_T_MAX : dl.min_periods, dl.inv_scale,
                                      dl.window, &at_l, &out_l))
                goto next;
        }
        if (g != Py_None) {
            double gv = PyFloat_AS_DOUBLE(g);
            if (!isfinite(gv))
                goto next;
            score_g = gv > 0;
            if (score_g) {
                vg = dg.log ? log(gv) : gv;
                up_g = above_cap(&dg, vg);
                if (up_g < 0 || (up_g && (up_l || !range_plain(&dg, vg))) || PyList_GET_SIZE(dg.values) + 1 >= dg.trim_at
                        || !baseline_plan(&dg.sorted, dg.values, vg, up_g ? PY_SSIZE_T_MAX : dg.min_periods,
                                          dg.inv_scale, dg.window, &at_g, &out_g))
                    goto next;
            }
        }
        if (score_l) {
            xl = dl.log ? PyFloat_FromDouble(vl) : (Py_INCREF(lo_), lo_);
            if (!xl || baseline_commit(&dl.sorted, dl.values, dl.steps, xl, step, at_l, out_l) < 0) {
                done = -1;
                goto next;
            }
        }
        if (score_g) {
            xg = dg.log ? PyFloat_FromDouble(vg) : (Py_INCREF(g), g);
            if (!xg || baseline_commit(&dg.sorted, dg.values, dg.steps, xg, step, at_g, out_g) < 0) {
                done = -1;
                goto next;
            }
        }
        if (st != Py_None) {
            double s = PyFloat_AS_DOUBLE(st);
            if (s > 0 && isfinite(s)) {
                if (tk != Py_None) {
                    tokens += t;
                    token_time += s;
                    if (mfu) {
                        double m = (double)((__int128)fpt * t) / s / peak;
                        mfu_sum += m;
                        mfu_count++;
                        if (m < mfu_min)
                            mfu_min = m;
                        if (m > mfu_max)
                            mfu_max = m;
                        if (m > 1.0)
                            mfu_over++;
                    }
                }
            }
        }
        if (tk != Py_None)
            all_tokens += t;
        else
            without++;
        if (ns > 0)
            busy += ns;
        else
            without_time++;
        last = ev;
        done = 1;
    next:
        Py_XDECREF(step); Py_XDECREF(lo_); Py_XDECREF(g); Py_XDECREF(st); Py_XDECREF(tk); Py_XDECREF(ex);
        Py_XDECREF(fp); Py_XDECREF(xl); Py_XDECREF(xg);
        if (done < 0)
            return NULL;
        if (!done)
            break;
    }
    PyObject *last_step = last ? PyObject_GetAttr(last, S_step) : (Py_INCREF(Py_None), Py_None);
    if (!last_step)
        return NULL;
    return Py_BuildValue("(nNLddnddnLnLn)", i, last_step, tokens, token_time, mfu_sum, mfu_count, mfu_min, mfu_max,
                         mfu_over, all_tokens, without, busy, without_time);
}

static PyMethodDef methods[] = {
    {"baseline_step", (PyCFunction)(void (*)(void))baseline_step, METH_FASTCALL,
     "The health detector's common step: add x to the baseline (True), or leave it to the caller (False)."},
    {"health_run", (PyCFunction)(void (*)(void))health_run, METH_FASTCALL,
     "HealthProjection._step over a run of common step records; stops at the first that is not."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "trainledger.training.health._fastfolds", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastfolds(void)
{
    if (!(S_step = PyUnicode_InternFromString("step")) || !(S_loss = PyUnicode_InternFromString("loss"))
            || !(S_grad_norm = PyUnicode_InternFromString("grad_norm"))
            || !(S_step_time_s = PyUnicode_InternFromString("step_time_s"))
            || !(S_tokens = PyUnicode_InternFromString("tokens")) || !(S_examples = PyUnicode_InternFromString("examples"))
            || !(S_batch_fingerprint = PyUnicode_InternFromString("batch_fingerprint")))
        return NULL;
    return PyModule_Create(&module);
}
