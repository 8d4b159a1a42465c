/*
 * The drop-in's uppercase collectives (mpiring.buffer_api) in their common forms, read in C:
 * dropin_call turns `comm.Allreduce([x, MPI.FLOAT], [y, MPI.FLOAT])` and its kin into the
 * arguments of the engine's blocking run, so that such a call costs about what the lowercase one
 * does. Anything else (derived datatypes, v-variants, arguments to refuse) gets None, and
 * buffer_api's Python parse (BufferAPI) takes the call, with its errors.
 */
#include "replay.h"

/* What each uppercase collective is, in dropin_call's first argument (buffer_api.COMMON_FORMS) */
enum { D_BCAST, D_REDUCE, D_ALLREDUCE, D_GATHER, D_ALLGATHER, D_SCATTER, D_ALLTOALL, D_SCAN, D_EXSCAN, D_ALLTOALLV,
       D_REDUCE_SCATTER, D_KINDS };
static const char *const lowercase[D_KINDS] = {"broadcast", "reduce",   "allreduce", "gather", "allgather",
                                               "scatter",   "alltoall", "scan",      "exscan", "alltoallv",
                                               "reduce_scatter"};
static PyObject *names[D_KINDS]; /* the lowercase names, interned */
static PyObject *op_names;       /* {id(op): (op, name)}: mpi4py's predefined ops (dropin_tables) */
static PyObject *in_place;       /* MPI.IN_PLACE */
static PyObject *empty;          /* numpy.empty */
static PyObject *int_arrays;     /* array.array: counts as mpi4py's demos give them */
static PyObject *exchange;       /* the algorithm an in-place all-to-all runs (buffer_api.IN_PLACE_ALLTOALL) */
static PyObject *abandoning;     /* the errors after which a call's buffers stay with the ring (Ring.abandon) */

/* dropin_tables(ops, in_place, empty, int_arrays, in_place_alltoall, abandoning): the ops
   buffer_specs knows, MPI.IN_PLACE, numpy.empty, array.array, the algorithm an in-place all-to-all
   runs and the errors that leave a call's buffers in MPI's hands (once). */
PyObject *dropin_tables(PyObject *module, PyObject *args) {
    PyObject *ops, *place, *make, *arrays, *algorithm, *errors;
    if (!PyArg_ParseTuple(args, "O!OOOUO!", &PyDict_Type, &ops, &place, &make, &arrays, &algorithm, &PyTuple_Type,
                          &errors))
        return NULL;
    Py_XSETREF(abandoning, Py_NewRef(errors));
    for (int k = 0; k < D_KINDS; k++)
        if (names[k] == NULL && (names[k] = PyUnicode_InternFromString(lowercase[k])) == NULL)
            return NULL;
    Py_XSETREF(op_names, Py_NewRef(ops));
    Py_XSETREF(in_place, Py_NewRef(place));
    Py_XSETREF(empty, Py_NewRef(make));
    Py_XSETREF(int_arrays, Py_NewRef(arrays));
    Py_XSETREF(exchange, Py_NewRef(algorithm));
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

/* A spec's elements (a new reference), or NULL where spec_elements found no common form; a byte
   buffer's may be a kept array (the call blocks). */
static PyObject *elements(PyObject *spec, Py_ssize_t blocks) {
    PyObject *items = spec_elements(spec, blocks, 1);
    if (items == Py_None) {
        Py_DECREF(items);
        return NULL;
    }
    return items;
}

static PyObject *spare; /* the last array `throwaway` made, kept for the next call of its size */

/* An uninitialised array of `count` elements of flat `like`'s dtype (a new reference): an
   in-place scatter root's block, which stays in its send buffer. The last one made serves again
   while nothing else holds it (a blocking call lets go of it when it returns, an abandoned one
   keeps it): a large array made anew each call costs its page faults every time. */
static PyObject *throwaway(PyObject *like, Py_ssize_t count) {
    PyObject *made;
    if (spare != NULL && Py_REFCNT(spare) == 1 && dtype_of(spare) == dtype_of(like) && length_of(spare) == count) {
        made = Py_NewRef(spare);
    } else {
        PyObject *length = PyLong_FromSsize_t(count), *args[2] = {length, dtype_of(like)};
        made = length ? PyObject_Vectorcall(empty, args, 2, NULL) : NULL;
        Py_XDECREF(length);
        if (made == NULL || Py_TYPE(made) != readable_arrays || ((const ArrayHead *)made)->nd != 1) {
            Py_XDECREF(made);
            return NULL;
        }
        Py_XSETREF(spare, Py_NewRef(made));
    }
    return made;
}

/* `size` ints >= 0 from a list, a tuple or an array.array, into `into`: 0, else -1 (no error set). */
static int read_counts(PyObject *given, Py_ssize_t size, Py_ssize_t *into) {
    PyObject *type = (PyObject *)Py_TYPE(given);
    if (type != (PyObject *)&PyList_Type && type != (PyObject *)&PyTuple_Type && type != int_arrays)
        return -1;
    if (PySequence_Size(given) != size) {
        PyErr_Clear();
        return -1;
    }
    for (Py_ssize_t i = 0; i < size; i++) {
        PyObject *item = PySequence_GetItem(given, i);
        into[i] = item != NULL && PyLong_CheckExact(item) ? PyLong_AsSsize_t(item) : -1;
        Py_XDECREF(item);
        if (into[i] < 0) {
            PyErr_Clear();
            return -1;
        }
    }
    return 0;
}

/* A v-variant spec whose displacements pack its blocks in rank order, [buf, counts, datatype] or
   [buf, (counts, displs), datatype] (buffer_specs.packed_blocks): its first sum(counts) elements
   (a new reference), `counts` filled (`size` of them); NULL (no error set) where not. */
static PyObject *packed(PyObject *spec, Py_ssize_t size, Py_ssize_t *counts, Py_ssize_t *displs) {
    if (!PyList_CheckExact(spec) || PyList_GET_SIZE(spec) != 3)
        return NULL;
    PyObject *given = PyList_GET_ITEM(spec, 1), *at = NULL;
    if (PyTuple_CheckExact(given) && PyTuple_GET_SIZE(given) == 2) {
        at = PyTuple_GET_ITEM(given, 1);
        given = PyTuple_GET_ITEM(given, 0);
    }
    if (read_counts(given, size, counts) < 0 || (at != NULL && read_counts(at, size, displs) < 0))
        return NULL;
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < size; i++) {
        if ((at != NULL && displs[i] != total) || counts[i] > PY_SSIZE_T_MAX - total) /* (no buffer holds that) */
            return NULL;
        total += counts[i];
    }
    PyObject *plain = PyList_New(2), *items = NULL;
    if (plain != NULL) {
        PyList_SET_ITEM(plain, 0, Py_NewRef(PyList_GET_ITEM(spec, 0)));
        PyList_SET_ITEM(plain, 1, Py_NewRef(PyList_GET_ITEM(spec, 2)));
        items = elements(plain, 1);
        Py_DECREF(plain);
    }
    if (items == NULL || length_of(items) < total) {
        Py_XDECREF(items);
        PyErr_Clear();
        return NULL;
    }
    if (length_of(items) == total)
        return items;
    PyObject *first = PySequence_GetSlice(items, 0, total);
    Py_DECREF(items);
    return first;
}

/* The tuple of `size` counts (a new reference) */
static PyObject *counts_tuple(const Py_ssize_t *counts, Py_ssize_t size) {
    PyObject *made = PyTuple_New(size);
    for (Py_ssize_t i = 0; made != NULL && i < size; i++) {
        PyObject *count = PyLong_FromSsize_t(counts[i]);
        if (count == NULL)
            Py_CLEAR(made);
        else
            PyTuple_SET_ITEM(made, i, count);
    }
    return made;
}

/* Alltoallv's (x, out, (send counts, receive counts)) for packed specs, in place included (x is
   out); 0, else -1 (no error set: the parse looks). */
static int alltoallv_of(PyObject *sendbuf, PyObject *recvbuf, Py_ssize_t size, PyObject **x, PyObject **out,
                        PyObject **counts) {
    Py_ssize_t *room = PyMem_Malloc((size_t)(4 * size) * sizeof(Py_ssize_t));
    if (room == NULL)
        return -1;
    Py_ssize_t *receive = room, *send = room + size, *displs = room + 2 * size;
    PyObject *sent = NULL, *received = NULL;
    *out = packed(recvbuf, size, receive, displs);
    if (*out == NULL) {
        PyMem_Free(room);
        return -1;
    }
    if (sendbuf == in_place || sendbuf == Py_None) {
        *x = Py_NewRef(*out);
        memcpy(send, receive, (size_t)size * sizeof(Py_ssize_t));
    } else {
        *x = packed(sendbuf, size, send, displs);
    }
    if (*x != NULL && dtype_of(*x) == dtype_of(*out)) {
        sent = counts_tuple(send, size);
        received = sent ? counts_tuple(receive, size) : NULL;
        *counts = received ? PyTuple_Pack(2, sent, received) : NULL;
    }
    PyMem_Free(room);
    Py_XDECREF(sent);
    Py_XDECREF(received);
    if (*x != NULL && *counts != NULL)
        return 0;
    Py_CLEAR(*x);
    Py_CLEAR(*out);
    return -1;
}

/* (k, k, ..., k): `size` times (a new reference) */
static PyObject *even_counts(Py_ssize_t k, Py_ssize_t size) {
    PyObject *each = PyLong_FromSsize_t(k), *counts = each ? PyTuple_New(size) : NULL;
    for (Py_ssize_t i = 0; counts != NULL && i < size; i++)
        PyTuple_SET_ITEM(counts, i, Py_NewRef(each));
    Py_XDECREF(each);
    return counts;
}

/* dropin_call(kind, sendbuf, recvbuf, op, root, place, run): the common forms of an uppercase
   call read into the engine's blocking run's arguments (collective, x, out, op, root, counts,
   algorithm, timeout=None), which it then calls, `run(...)`, returning what that returns;
   NotImplemented, with nothing run, where buffer_api's parse must look. `place` is the
   communicator's (rank, size). The buffers are views of the caller's memory (spec_elements): send
   and receive of one dtype, their counts as MPI needs. An in-place Reduce_scatter_block runs
   into an array of its own, whose block it copies into the receive buffer's first once the run
   returned. */
PyObject *dropin_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7 || op_names == NULL || !PyTuple_CheckExact(args[5]) || PyTuple_GET_SIZE(args[5]) != 2)
        Py_RETURN_NOTIMPLEMENTED;
    int kind = PyLong_CheckExact(args[0]) ? (int)PyLong_AsLong(args[0]) : -1;
    PyObject *sendbuf = args[1], *recvbuf = args[2], *op = args[3], *root = args[4], *run = args[6];
    Py_ssize_t rank = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[5], 0)), size = PyLong_AsSsize_t(PyTuple_GET_ITEM(args[5], 1));
    if (PyErr_Occurred() || kind < 0 || kind >= D_KINDS || size < 1) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    int rooted = kind == D_BCAST || kind == D_REDUCE || kind == D_GATHER || kind == D_SCATTER;
    int reduces = kind == D_REDUCE || kind == D_ALLREDUCE || kind == D_SCAN || kind == D_EXSCAN || kind == D_REDUCE_SCATTER;
    Py_ssize_t at = -1;
    if (rooted) {
        at = PyLong_CheckExact(root) ? PyLong_AsSsize_t(root) : -1;
        if (at < 0 || at >= size) { /* (the parse says what is wrong with it) */
            PyErr_Clear();
            Py_RETURN_NOTIMPLEMENTED;
        }
    }
    PyObject *name = reduces ? op_name(op) : Py_None;
    if (name == NULL)
        Py_RETURN_NOTIMPLEMENTED;
    int root_here = rank == at;
    PyObject *x = NULL, *out = NULL, *counts = NULL, *result_block = NULL;
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
        if (sendbuf != in_place && sendbuf != Py_None)
            x = elements(sendbuf, blocks_in);
        else if (kind == D_GATHER || kind == D_ALLGATHER) /* in place: this rank's block, where it lies */
            x = own_block(out, rank * (length_of(out) / size), (rank + 1) * (length_of(out) / size));
        else
            x = Py_NewRef(out);
        if (x != NULL && (dtype_of(x) != dtype_of(out) || length_of(x) * blocks_out != length_of(out) * blocks_in))
            Py_CLEAR(x);
        break;
    case D_SCATTER: /* the send buffer counts at the root only */
        if (!root_here) {
            out = recvbuf == in_place || recvbuf == Py_None ? NULL : elements(recvbuf, 1);
            x = out ? Py_NewRef(Py_None) : NULL;
            break;
        }
        x = elements(sendbuf, size);
        if (x == NULL)
            break;
        if (recvbuf == in_place || recvbuf == Py_None) /* in place: the root's block stays where it is */
            out = throwaway(x, length_of(x) / size);
        else
            out = elements(recvbuf, 1);
        if (out != NULL && (dtype_of(x) != dtype_of(out) || length_of(x) != length_of(out) * size))
            Py_CLEAR(x);
        break;
    case D_ALLTOALLV:
        alltoallv_of(sendbuf, recvbuf, size, &x, &out, &counts);
        break;
    case D_REDUCE_SCATTER: /* Reduce_scatter_block */
        if (sendbuf == in_place || sendbuf == Py_None) { /* every block in the receive buffer; the result to its first */
            x = elements(recvbuf, size);
            if (x != NULL && (((const ArrayHead *)x)->flags & ARRAY_WRITEABLE) &&
                (out = throwaway(x, length_of(x) / size)) != NULL &&
                (result_block = PySequence_GetSlice(x, 0, length_of(out))) == NULL)
                Py_CLEAR(out);
            break;
        }
        if ((out = elements(recvbuf, 1)) == NULL)
            break;
        x = elements(sendbuf, size);
        if (x != NULL && (dtype_of(x) != dtype_of(out) || length_of(x) != length_of(out) * size))
            Py_CLEAR(x);
        break;
    }
    if (x == NULL || out == NULL) {
        Py_XDECREF(x);
        Py_XDECREF(out);
        Py_XDECREF(counts);
        Py_XDECREF(result_block);
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (kind == D_GATHER || kind == D_ALLGATHER || kind == D_SCATTER || kind == D_REDUCE_SCATTER) {
        counts = even_counts(kind == D_SCATTER || kind == D_REDUCE_SCATTER ? length_of(out) : length_of(x), size);
        if (counts == NULL) {
            Py_DECREF(x);
            Py_DECREF(out);
            Py_XDECREF(result_block);
            return NULL;
        }
    }
    /* every rank's all-to-all is in place or none is (MPI): in place, all run the one that exchanges in place */
    int exchanged = (kind == D_ALLTOALL || kind == D_ALLTOALLV) && (sendbuf == in_place || sendbuf == Py_None);
    PyObject *call[8] = {names[kind], x, out, name, rooted ? root : Py_None, counts ? counts : Py_None,
                         exchanged ? exchange : Py_None, Py_None};
    PyObject *result = PyObject_Vectorcall(run, call, 8, NULL);
    if (result == NULL && PyErr_ExceptionMatches(abandoning)) { /* MPI may still use the buffers: keep them */
        PyObject *type, *error, *traceback;
        PyErr_Fetch(&type, &error, &traceback);
        pin_buffer(sendbuf);
        pin_buffer(recvbuf);
        PyErr_Restore(type, error, traceback);
    }
    if (result != NULL && result_block != NULL) { /* both flat and C-contiguous, of one dtype and length */
        Py_buffer from, to;
        int copied = -1;
        if (PyObject_GetBuffer(out, &from, PyBUF_C_CONTIGUOUS) == 0) {
            if (PyObject_GetBuffer(result_block, &to, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) == 0) {
                if (to.len == from.len) {
                    memmove(to.buf, from.buf, (size_t)from.len);
                    copied = 0;
                }
                PyBuffer_Release(&to);
            }
            PyBuffer_Release(&from);
        }
        if (copied < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "Reduce_scatter_block: the result block is not the receive buffer's");
            Py_CLEAR(result);
        }
    }
    Py_DECREF(x);
    Py_DECREF(out);
    Py_XDECREF(counts);
    Py_XDECREF(result_block);
    return result;
}
