/*
 * Where a field of a msgspec Struct lives, for the accelerators that read events' fields from their slots: the
 * core's step records and writer, the views' columns, the health folds. Included by each extension (every one
 * gets its own static copy); needs Python.h and structmember.h first.
 */
#ifndef TRAINLEDGER_SLOTS_H
#define TRAINLEDGER_SLOTS_H


/* Where a field of the step record lives: the offset its member descriptor reads (a msgspec Struct keeps each
 * field in a slot), or -1 to ask by name. */
static Py_ssize_t slot_of(PyTypeObject *t, PyObject *name)
{
    PyObject *d = PyObject_GetAttr((PyObject *)t, name);
    Py_ssize_t off = -1;
    if (d == NULL) {
        PyErr_Clear();
        return -1;
    }
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type == T_OBJECT_EX && !(m->flags & READ_RESTRICTED))
            off = m->offset;
    }
    Py_DECREF(d);
    return off;
}

#endif
