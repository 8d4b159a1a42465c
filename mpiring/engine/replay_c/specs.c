/*
 * mpi4py's buffer specs in their common forms, read in C: spec_items is the first look of
 * mpiring.buffer_specs.simple, with the tables spec_tables is given once.
 *
 * A byte buffer (bytearray, mmap) is seen as a NumPy array of its memory. numpy.frombuffer would
 * make one per call, a large part of a small call's cost; a blocking drop-in call instead borrows
 * one of a few arrays kept by address (`borrowed_bytes`), which hold no export of the buffer, so
 * the caller may still resize or close it between calls. So does a NumPy array seen as another
 * datatype's elements ([floats, MPI.BYTE]), which would otherwise be a new view each call.
 */
#include "replay.h"

static PyObject *spec_datatypes; /* {id(datatype): (datatype, dtype)}: the predefined datatypes a dtype moves as */
static PyObject *spec_dtypes;    /* the dtypes mpiring moves (a frozenset) */
static PyObject *spec_bytes;     /* {type: what makes an array of its bytes}: bytearray, mmap (numpy.frombuffer) */
static PyObject *frombuffer;     /* numpy.frombuffer(buffer, dtype, count) */
static PyObject *array_at;       /* native.array_at(address, nbytes, dtype, count, readonly) */

/* spec_tables(datatypes, dtypes, byte_buffers, frombuffer, array_at): the tables spec_items reads
   (buffer_specs', once), numpy.frombuffer and what makes an array at an address. */
PyObject *spec_tables(PyObject *module, PyObject *args) {
    PyObject *datatypes, *dtypes, *byte_buffers, *made_from_buffer, *made_at;
    if (!PyArg_ParseTuple(args, "O!O!O!OO", &PyDict_Type, &datatypes, &PyFrozenSet_Type, &dtypes, &PyDict_Type,
                          &byte_buffers, &made_from_buffer, &made_at))
        return NULL;
    Py_XSETREF(spec_datatypes, Py_NewRef(datatypes));
    Py_XSETREF(spec_dtypes, Py_NewRef(dtypes));
    Py_XSETREF(spec_bytes, Py_NewRef(byte_buffers));
    Py_XSETREF(frombuffer, Py_NewRef(made_from_buffer));
    Py_XSETREF(array_at, Py_NewRef(made_at));
    Py_RETURN_NONE;
}

/* The arrays borrowed_bytes keeps: one per (address, dtype, count, read-only), the oldest replaced */
enum { BORROWED = 8 };
static struct {
    char *address;
    PyObject *dtype; /* NULL: bytes */
    Py_ssize_t count; /* -1: the whole buffer */
    int readonly;
    PyObject *array;
    PyObject *block; /* its in-place block (own_block), or NULL */
    Py_ssize_t block_start;
} borrowed[BORROWED];
static int next_borrowed;

/* A byte buffer's memory as `count` elements of `dtype` (-1: all it holds; dtype NULL: bytes), for
   a blocking call that lets go of it when it returns: a kept array where one of this address,
   dtype, count and access still fits in the buffer's length now, else a new one kept (a new
   reference). NULL, no error set, where there is none (a buffer too short). */
static PyObject *borrowed_bytes(PyObject *buffer, PyObject *dtype, Py_ssize_t count) {
    Py_buffer view;
    if (readable_arrays == NULL || array_at == NULL || PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        return NULL;
    }
    char *address = view.buf;
    Py_ssize_t length = view.len;
    int readonly = view.readonly;
    PyBuffer_Release(&view);
    for (int i = 0; i < BORROWED; i++) {
        if (borrowed[i].array == NULL || borrowed[i].address != address || borrowed[i].dtype != dtype ||
            borrowed[i].count != count || borrowed[i].readonly != readonly)
            continue;
        const ArrayHead *a = (const ArrayHead *)borrowed[i].array;
        Py_ssize_t bytes = a->dimensions[0] * a->strides[0];
        if (count < 0 ? bytes == length : bytes <= length)
            return Py_NewRef(borrowed[i].array);
    }
    PyObject *made = PyObject_CallFunction(array_at, "nnOnO", (Py_ssize_t)(uintptr_t)address, length,
                                           dtype ? dtype : Py_None, count, readonly ? Py_True : Py_False);
    if (made == NULL || Py_TYPE(made) != readable_arrays || ((const ArrayHead *)made)->nd != 1) {
        Py_XDECREF(made);
        PyErr_Clear();
        return NULL;
    }
    int k = next_borrowed;
    next_borrowed = (k + 1) % BORROWED;
    borrowed[k].address = address;
    borrowed[k].dtype = dtype; /* (held by spec_datatypes' table) */
    borrowed[k].count = count;
    borrowed[k].readonly = readonly;
    Py_XSETREF(borrowed[k].array, Py_NewRef(made));
    Py_CLEAR(borrowed[k].block);
    return made;
}

/* Elements start:stop of flat `array` (a new reference): an in-place call's own block. Of a
   borrowed array, the block kept with it where it is the same one, so that a repeated call
   passes the very arrays it passed last (the Shortcut's memo then takes it). */
PyObject *own_block(PyObject *array, Py_ssize_t start, Py_ssize_t stop) {
    for (int i = 0; i < BORROWED; i++) {
        if (borrowed[i].array != array)
            continue;
        PyObject *block = borrowed[i].block;
        if (block != NULL && borrowed[i].block_start == start && ((const ArrayHead *)block)->dimensions[0] == stop - start)
            return Py_NewRef(block);
        block = PySequence_GetSlice(array, start, stop);
        if (block != NULL && Py_TYPE(block) == readable_arrays) {
            Py_XSETREF(borrowed[i].block, Py_NewRef(block));
            borrowed[i].block_start = start;
        }
        return block;
    }
    return PySequence_GetSlice(array, start, stop);
}

/* Keep `spec`'s buffer exported for good: a borrowed array of it (a byte buffer's, or a NumPy
   array's seen as another datatype) stays with a call a timeout or a lost peer left (Ring.abandon),
   into which MPI may still write, so its memory must stay. */
void pin_buffer(PyObject *spec) {
    PyObject *buffer = PyList_CheckExact(spec) && PyList_GET_SIZE(spec) > 0 ? PyList_GET_ITEM(spec, 0) : spec;
    if (spec_bytes == NULL ||
        (Py_TYPE(buffer) != readable_arrays && PyDict_Contains(spec_bytes, (PyObject *)Py_TYPE(buffer)) != 1)) {
        PyErr_Clear();
        return;
    }
    Py_buffer *pinned = PyMem_Malloc(sizeof(Py_buffer));
    if (pinned != NULL && PyObject_GetBuffer(buffer, pinned, PyBUF_SIMPLE) < 0) {
        PyMem_Free(pinned);
        PyErr_Clear();
    } /* (never released) */
}

/* [byte buffer, count, datatype] in `blocks` blocks: its count * blocks elements of `dtype`, read
   in one call (no array of the whole buffer, no view, no slice); None where the buffer is too
   short or the count no int (the parse says why). */
static PyObject *counted_bytes(PyObject *buffer, PyObject *count, PyObject *dtype, Py_ssize_t blocks, int borrow) {
    Py_ssize_t each = PyLong_CheckExact(count) ? PyLong_AsSsize_t(count) : -1;
    Py_ssize_t elements = each >= 0 && each <= PY_SSIZE_T_MAX / blocks ? each * blocks : -1;
    PyObject *kept = borrow && elements >= 0 ? borrowed_bytes(buffer, dtype, elements) : NULL;
    if (kept != NULL)
        return kept;
    PyObject *total = elements >= 0 ? PyLong_FromSsize_t(elements) : NULL;
    PyObject *args[3] = {buffer, dtype, total};
    PyObject *items = total ? PyObject_Vectorcall(frombuffer, args, 3, NULL) : NULL;
    Py_XDECREF(total);
    if (items == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return items;
}

/* `buffer` as a NumPy array: itself, or the array of its bytes (of `dtype`'s elements where
   borrowed) where it is a byte buffer the tables name (a new reference); NULL, no error set, where
   it is neither. */
static PyObject *as_array(PyObject *buffer, PyObject *dtype, int borrow) {
    if (Py_TYPE(buffer) == readable_arrays)
        return Py_NewRef(buffer);
    PyObject *make = PyDict_GetItemWithError(spec_bytes, (PyObject *)Py_TYPE(buffer)); /* borrowed */
    PyObject *array = make && borrow ? borrowed_bytes(buffer, dtype, -1) : NULL;
    if (array != NULL)
        return array;
    array = make ? PyObject_CallOneArg(make, buffer) : NULL;
    if (array == NULL)
        PyErr_Clear();
    return array;
}

/* Whether `array` is a readable one-axis C-contiguous NumPy array: its length then, else -1. */
static Py_ssize_t flat_length(PyObject *array) {
    const ArrayHead *a = (const ArrayHead *)array;
    if (Py_TYPE(array) != readable_arrays || a->nd != 1 || !(a->flags & ARRAY_C_CONTIGUOUS))
        return -1;
    return a->dimensions[0];
}

/* spec_items(spec, blocks): the elements a spec names, for its common forms: a flat NumPy array
   of a dtype mpiring moves, or a byte buffer (bytearray, mmap); [buffer, datatype] and [buffer,
   count, datatype] with such a buffer and a predefined datatype, read as that datatype's elements
   (`count` per block: `blocks` of them, as MPI counts a gather's receive buffer). The array, a
   view of it, or its first elements; None where the generic parse must look (any other form, or
   one it must refuse). Never raises for a spec. Its byte buffers' arrays are their own (a
   nonblocking call holds them to its end). */
PyObject *spec_items(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyLong_CheckExact(args[1]))
        return PyErr_Format(PyExc_TypeError, "spec_items(spec, blocks)");
    Py_ssize_t blocks = PyLong_AsSsize_t(args[1]);
    if (blocks < 1) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return spec_elements(args[0], blocks, 0);
}

/* spec_items' reading of `spec` in `blocks` blocks (>= 1): a new reference to the elements, or to
   None. `borrow`: a byte buffer's array may be a kept one (borrowed_bytes), for a blocking call. */
PyObject *spec_elements(PyObject *spec, Py_ssize_t blocks, int borrow) {
    Py_ssize_t length;
    if (spec_datatypes == NULL)
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_CheckExact(spec) ? PyList_GET_SIZE(spec) : 0;
    if (n == 0) { /* a buffer alone: a flat array of a dtype mpiring moves, or a byte buffer's bytes */
        PyObject *array = as_array(spec, NULL, borrow);
        if (array == NULL)
            Py_RETURN_NONE;
        int moved = (length = flat_length(array)) >= 0
                        ? PySet_Contains(spec_dtypes, ((const ArrayHead *)array)->descr)
                        : 0;
        PyErr_Clear();
        if (moved > 0 && length % blocks == 0)
            return array;
        Py_DECREF(array);
        Py_RETURN_NONE;
    }
    if (n != 2 && n != 3)
        Py_RETURN_NONE;
    PyObject *datatype = PyList_GET_ITEM(spec, n - 1);
    PyObject *key = PyLong_FromVoidPtr(datatype);
    PyObject *named = key ? PyDict_GetItemWithError(spec_datatypes, key) : NULL; /* borrowed */
    Py_XDECREF(key);
    if (named == NULL || !PyTuple_CheckExact(named) || PyTuple_GET_SIZE(named) != 2 ||
        PyTuple_GET_ITEM(named, 0) != datatype) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *buffer = PyList_GET_ITEM(spec, 0), *dtype = PyTuple_GET_ITEM(named, 1), *items;
    if (n == 3 && Py_TYPE(buffer) != readable_arrays) {
        int bytes = PyDict_Contains(spec_bytes, (PyObject *)Py_TYPE(buffer));
        PyErr_Clear();
        if (bytes == 1)
            return counted_bytes(buffer, PyList_GET_ITEM(spec, 1), dtype, blocks, borrow);
    }
    PyObject *array = as_array(buffer, dtype, borrow);
    if (array == NULL)
        Py_RETURN_NONE;
    if ((length = flat_length(array)) < 0) {
        Py_DECREF(array);
        Py_RETURN_NONE;
    }
    if (dtype == ((const ArrayHead *)array)->descr) {
        items = array;
    } else { /* the memory seen as the datatype's elements, as MPI sees it ([floats, MPI.BYTE]): for
                a blocking call a kept array at its address, as a byte buffer's, else a view */
        int moved = PySet_Contains(spec_dtypes, ((const ArrayHead *)array)->descr) == 1;
        items = moved && borrow ? borrowed_bytes(array, dtype, -1) : NULL;
        if (items == NULL && moved)
            items = PyObject_CallMethodOneArg(array, s_view, dtype);
        Py_DECREF(array);
        if (items == NULL || (length = flat_length(items)) < 0) {
            PyErr_Clear(); /* (a length that is no whole number of its elements: the parse says so) */
            Py_XDECREF(items);
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t each = length / blocks;
    if (n == 3) {
        PyObject *count = PyList_GET_ITEM(spec, 1);
        each = PyLong_CheckExact(count) ? PyLong_AsSsize_t(count) : -1;
        if (each < 0 || each > length / blocks) /* (also an int past Py_ssize_t: -1 with an error) */
            each = -1;
        PyErr_Clear();
    } else if (length % blocks) {
        each = -1;
    }
    if (each < 0) {
        Py_DECREF(items);
        Py_RETURN_NONE;
    }
    if (each * blocks == length)
        return items;
    PyObject *first = PySequence_GetSlice(items, 0, each * blocks);
    Py_DECREF(items);
    return first;
}
