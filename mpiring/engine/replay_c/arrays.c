/*
 * NumPy arrays read without NumPy's headers: read_arrays checks once that an array's leading
 * fields are where replay.h's ArrayHead says (then they are read directly), and memory_of gives
 * the memory a run binds, through those fields or else the buffer protocol.
 */
#include "replay.h"

PyTypeObject *readable_arrays; /* numpy.ndarray, once its fields were found where expected */

/* read_arrays(samples): samples of (array, address, shape, strides, c_contiguous, writeable) as
   NumPy describes them; True (and the fields are read directly from now on) if every one agrees. */
PyObject *read_arrays(PyObject *module, PyObject *samples) {
    PyTypeObject *type = NULL;
    Py_ssize_t n = PyTuple_Check(samples) ? PyTuple_GET_SIZE(samples) : 0;
    int agree = n > 0;
    for (Py_ssize_t i = 0; agree && i < n; i++) {
        PyObject *array, *shape, *strides;
        unsigned long long address;
        int contiguous, writeable;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(samples, i), "OKO!O!pp", &array, &address, &PyTuple_Type, &shape,
                              &PyTuple_Type, &strides, &contiguous, &writeable))
            return NULL;
        const ArrayHead *a = (const ArrayHead *)array;
        type = type ? type : Py_TYPE(array);
        agree = Py_TYPE(array) == type && (unsigned long long)(uintptr_t)a->data == address &&
                a->nd == PyTuple_GET_SIZE(shape) && a->nd == PyTuple_GET_SIZE(strides) &&
                !(a->flags & ARRAY_C_CONTIGUOUS) == !contiguous && !(a->flags & ARRAY_WRITEABLE) == !writeable &&
                a->descr == PyObject_GetAttr(array, s_dtype); /* (a new reference, given back below) */
        if (agree)
            Py_DECREF(a->descr);
        PyErr_Clear();
        for (int d = 0; agree && d < a->nd; d++)
            agree = a->dimensions[d] == PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d)) &&
                    a->strides[d] == PyLong_AsSsize_t(PyTuple_GET_ITEM(strides, d));
    }
    if (PyErr_Occurred())
        return NULL;
    readable_arrays = agree ? type : NULL;
    return PyBool_FromLong(agree);
}

/* The address of `array`'s memory if it is C-contiguous (and writable, if asked) and holds
   `bytes` (`items` elements of the dtype the Shortcut's key found the schedule by: -1, unknown);
   NULL (an error set) if not. A NumPy array's fields are read directly. */
char *memory_of(PyObject *array, Py_ssize_t bytes, Py_ssize_t items, int writable) {
    if (Py_TYPE(array) == readable_arrays && items >= 0) {
        const ArrayHead *a = (const ArrayHead *)array;
        Py_ssize_t elements = 1;
        for (int d = 0; d < a->nd; d++)
            elements *= a->dimensions[d];
        if ((a->flags & ARRAY_C_CONTIGUOUS) && (!writable || (a->flags & ARRAY_WRITEABLE)) && elements == items)
            return a->data;
        PyErr_SetString(PyExc_ValueError, "an array not C-contiguous, read-only, or of another size");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(array, &view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return NULL;
    char *start = view.buf;
    Py_ssize_t length = view.len;
    PyBuffer_Release(&view); /* the caller holds the array for the whole call */
    if (length != bytes) {
        PyErr_SetString(PyExc_ValueError, "an array of another size than its schedule's");
        return NULL;
    }
    return start;
}
