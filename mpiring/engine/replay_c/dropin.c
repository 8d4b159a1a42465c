/*
 * The drop-in's uppercase collectives (mpiring.buffer_api) in their common forms, read in C:
 * dropin_call turns `comm.Allreduce([x, MPI.FLOAT], [y, MPI.FLOAT])` and its kin into the
 * arguments of the engine's blocking run, so that such a call costs about what the lowercase one
 * does. Anything else (derived datatypes, v-variants, in-place gathers, arguments to refuse) gets
 * None, and buffer_api's Python parse takes the call, with its errors.
 */
#include "replay.h"

/* What each uppercase collective is, in dropin_call's first argument (buffer_api.DROPIN_CODES) */
enum { D_BCAST, D_REDUCE, D_ALLREDUCE, D_GATHER, D_ALLGATHER, D_SCATTER, D_ALLTOALL, D_SCAN, D_EXSCAN, D_KINDS };
static const char *const lowercase[D_KINDS] = {"broadcast", "reduce",   "allreduce", "gather", "allgather",
                                               "scatter",   "alltoall", "scan",      "exscan"};
static PyObject *names[D_KINDS]; /* the lowercase names, interned */
static PyObject *op_names;       /* {id(op): (op, name)}: mpi4py's predefined ops (dropin_tables) */
static PyObject *in_place;       /* MPI.IN_PLACE */

/* dropin_tables(ops, in_place): the ops buffer_api knows and MPI.IN_PLACE (once). */
PyObject *dropin_tables(PyObject *module, PyObject *args) {
    PyObject *ops, *place;
    if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &ops, &place))
        return NULL;
    for (int k = 0; k < D_KINDS; k++)
        if (names[k] == NULL && (names[k] = PyUnicode_InternFromString(lowercase[k])) == NULL)
            return NULL;
    Py_XSETREF(op_names, Py_NewRef(ops));
    Py_XSETREF(in_place, Py_NewRef(place));
    Py_RETURN_NONE;
}

/* The lowercase name of a predefined op (borrowed), or NULL (no error set) for any other. */
static PyObject *op_name(PyObject *op) {
    PyObject *key = PyLong_FromVoidPtr(op);
    PyObject *known = key ? PyDict_GetItemWithError(op_names, key) : NULL; /* borrowed */
    Py_XDECREF(key);
    PyErr_Clear();
    if (known == NULL || !PyTuple_CheckExact(known) || PyTuple_GET_SIZE(known) != 2 || PyTuple_GET_ITEM(known, 0) != op)
        return NULL;
    return PyTuple_GET_ITEM(known, 1);
}

static Py_ssize_t length_of(PyObject *items) { return ((const ArrayHead *)items)->dimensions[0]; }
static PyObject *dtype_of(PyObject *items) { return ((const ArrayHead *)items)->descr; }

/* A spec's elements (a new reference), or NULL where spec_elements found no common form. */
static PyObject *elements(PyObject *spec, Py_ssize_t blocks) {
    PyObject *items = spec_elements(spec, blocks);
    if (items == Py_None) {
        Py_DECREF(items);
        return NULL;
    }
    return items;
}

/* (k, k, ..., k): `size` times (a new reference) */
static PyObject *even_counts(Py_ssize_t k, Py_ssize_t size) {
    PyObject *each = PyLong_FromSsize_t(k), *counts = each ? PyTuple_New(size) : NULL;
    for (Py_ssize_t i = 0; counts != NULL && i < size; i++)
        PyTuple_SET_ITEM(counts, i, Py_NewRef(each));
    Py_XDECREF(each);
    return counts;
}

/* dropin_call(kind, sendbuf, recvbuf, op, root, rank, size): (collective, x, out, op, root,
   counts, None, None), the engine's blocking run's arguments, for the common forms of an
   uppercase call; None where buffer_api's parse must look. The buffers are views of the
   caller's memory (spec_elements): send and receive of one dtype, their counts as MPI needs. */
PyObject *dropin_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || op_names == NULL)
        Py_RETURN_NONE;
    int kind = PyLong_CheckExact(args[0]) ? (int)PyLong_AsLong(args[0]) : -1;
    PyObject *sendbuf = args[1], *recvbuf = args[2], *op = args[3], *root = args[4];
    Py_ssize_t rank = PyLong_AsSsize_t(args[5]), size = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred() || kind < 0 || kind >= D_KINDS || size < 1) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    int rooted = kind == D_BCAST || kind == D_REDUCE || kind == D_GATHER || kind == D_SCATTER;
    int reduces = kind == D_REDUCE || kind == D_ALLREDUCE || kind == D_SCAN || kind == D_EXSCAN;
    Py_ssize_t at = -1;
    if (rooted) {
        at = PyLong_CheckExact(root) ? PyLong_AsSsize_t(root) : -1;
        if (at < 0 || at >= size) { /* (the parse says what is wrong with it) */
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    }
    PyObject *name = reduces ? op_name(op) : Py_None;
    if (name == NULL)
        Py_RETURN_NONE;
    int root_here = rank == at;
    PyObject *x = NULL, *out = NULL, *counts = NULL;
    Py_ssize_t blocks_in = kind == D_SCATTER || kind == D_ALLTOALL ? size : 1;
    Py_ssize_t blocks_out = kind == D_GATHER || kind == D_ALLGATHER || kind == D_ALLTOALL ? size : 1;
    switch (kind) {
    case D_BCAST:
        x = elements(sendbuf, 1);
        out = Py_XNewRef(x);
        break;
    case D_REDUCE:
    case D_GATHER:      /* the receive buffer counts at the root only; in place is the root's */
        if (!root_here) {
            x = sendbuf == in_place || sendbuf == Py_None ? NULL : elements(sendbuf, 1);
            out = x ? Py_NewRef(Py_None) : NULL;
            break;
        }
        /* fall through: the root's buffers are those of the all- form */
    case D_ALLREDUCE:
    case D_ALLGATHER:
    case D_ALLTOALL:
    case D_SCAN:
    case D_EXSCAN:
        out = elements(recvbuf, blocks_out);
        if (out == NULL)
            break;
        if (sendbuf == in_place || sendbuf == Py_None) /* in place: gathers keep their own block apart (Python) */
            x = kind == D_GATHER || kind == D_ALLGATHER ? NULL : Py_NewRef(out);
        else
            x = elements(sendbuf, blocks_in);
        if (x != NULL && (dtype_of(x) != dtype_of(out) || length_of(x) * blocks_out != length_of(out) * blocks_in))
            Py_CLEAR(x);
        break;
    case D_SCATTER: /* the send buffer counts at the root only */
        out = recvbuf == in_place || recvbuf == Py_None ? NULL : elements(recvbuf, 1);
        if (out == NULL || !root_here) {
            x = out ? Py_NewRef(Py_None) : NULL;
            break;
        }
        x = elements(sendbuf, size);
        if (x != NULL && (dtype_of(x) != dtype_of(out) || length_of(x) != length_of(out) * size))
            Py_CLEAR(x);
        break;
    }
    if (x == NULL || out == NULL) {
        Py_XDECREF(x);
        Py_XDECREF(out);
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (kind == D_GATHER || kind == D_ALLGATHER || kind == D_SCATTER) {
        counts = even_counts(kind == D_SCATTER ? length_of(out) : length_of(x), size);
        if (counts == NULL) {
            Py_DECREF(x);
            Py_DECREF(out);
            return NULL;
        }
    }
    PyObject *call = PyTuple_New(8);
    if (call == NULL) {
        Py_DECREF(x);
        Py_DECREF(out);
        Py_XDECREF(counts);
        return NULL;
    }
    PyTuple_SET_ITEM(call, 0, Py_NewRef(names[kind]));
    PyTuple_SET_ITEM(call, 1, x);
    PyTuple_SET_ITEM(call, 2, out);
    PyTuple_SET_ITEM(call, 3, Py_NewRef(name));
    PyTuple_SET_ITEM(call, 4, rooted ? Py_NewRef(root) : Py_NewRef(Py_None));
    PyTuple_SET_ITEM(call, 5, counts ? counts : Py_NewRef(Py_None));
    PyTuple_SET_ITEM(call, 6, Py_NewRef(Py_None));
    PyTuple_SET_ITEM(call, 7, Py_NewRef(Py_None));
    return call;
}
