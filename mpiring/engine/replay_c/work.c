/*
 * A schedule's work: read from the tuples native.py gives (work_init), and done between a run's
 * exchanges (do_work): copies, the check of a layout just exchanged, NumPy's exact arithmetic,
 * and Python callables for the rest.
 */
#include "replay.h"

/* ---- arithmetic: out[i] = a[i] op b[i], exactly as NumPy's ufuncs ---- */

/* Unrolled so that each pass of the vector loop covers 64 bytes or more: a loop of one vector per
   pass runs up to twice as long where its few instructions straddle a 64-byte line of code,
   which any change elsewhere in the extension may bring about. */
#define LOOP(T, EXPR)                                                       \
    do {                                                                    \
        T *o = (T *)out;                                                    \
        const T *x = (const T *)a, *y = (const T *)b;                       \
        _Pragma("GCC unroll 4")                                             \
        for (Py_ssize_t i = 0; i < n; i++) {                                \
            T u = x[i], v = y[i];                                           \
            o[i] = (EXPR);                                                  \
        }                                                                   \
    } while (0)

/* integers: + and * wrap (done unsigned: signed overflow is undefined in C) */
#define INTEGER_OPS(T, U)                                                   \
    switch (op) {                                                           \
    case O_SUM: LOOP(T, (T)((U)u + (U)v)); return 0;                        \
    case O_PROD: LOOP(T, (T)((U)u * (U)v)); return 0;                       \
    case O_MIN: LOOP(T, u < v ? u : v); return 0;                           \
    case O_MAX: LOOP(T, u > v ? u : v); return 0;                           \
    case O_BAND: LOOP(T, u & v); return 0;                                  \
    case O_BOR: LOOP(T, u | v); return 0;                                   \
    case O_BXOR: LOOP(T, u ^ v); return 0;                                  \
    case O_LAND: LOOP(T, (T)((u != 0) && (v != 0))); return 0;              \
    case O_LOR: LOOP(T, (T)((u != 0) || (v != 0))); return 0;               \
    case O_LXOR: LOOP(T, (T)((u != 0) != (v != 0))); return 0;              \
    }                                                                       \
    return -1

static int op_loop(int op, int dtype, char *out, const char *a, const char *b, Py_ssize_t n) {
    switch (dtype) {
    case D_BOOL: /* NumPy's bool add is or, multiply and minimum are and, maximum is or */
        switch (op) {
        case O_SUM: case O_MAX: case O_BOR: case O_LOR: LOOP(unsigned char, (u != 0) | (v != 0)); return 0;
        case O_PROD: case O_MIN: case O_BAND: case O_LAND: LOOP(unsigned char, (u != 0) & (v != 0)); return 0;
        case O_BXOR: case O_LXOR: LOOP(unsigned char, (u != 0) ^ (v != 0)); return 0;
        }
        return -1;
    case D_INT8: INTEGER_OPS(int8_t, uint8_t);
    case D_INT16: INTEGER_OPS(int16_t, uint16_t);
    case D_INT32: INTEGER_OPS(int32_t, uint32_t);
    case D_INT64: INTEGER_OPS(int64_t, uint64_t);
    case D_UINT8: INTEGER_OPS(uint8_t, uint8_t);
    case D_UINT16: INTEGER_OPS(uint16_t, uint16_t);
    case D_UINT32: INTEGER_OPS(uint32_t, uint32_t);
    case D_UINT64: INTEGER_OPS(uint64_t, uint64_t);
    case D_FLOAT32:
        if (op == O_SUM) { LOOP(float, u + v); return 0; }
        if (op == O_PROD) { LOOP(float, u * v); return 0; }
        return -1;
    case D_FLOAT64:
        if (op == O_SUM) { LOOP(double, u + v); return 0; }
        if (op == O_PROD) { LOOP(double, u * v); return 0; }
        return -1;
    case D_COMPLEX64: /* a sum of complex numbers is two independent sums */
        if (op == O_SUM) { n *= 2; LOOP(float, u + v); return 0; }
        return -1;
    case D_COMPLEX128:
        if (op == O_SUM) { n *= 2; LOOP(double, u + v); return 0; }
        return -1;
    }
    return -1;
}

/* what op_loop does itself: native.py asks before recording WORK_OP */
static int op_supported(int op, int dtype) {
    if (op < 0 || op >= OPS || dtype < 0 || dtype >= DTYPES)
        return 0;
    if (dtype == D_FLOAT32 || dtype == D_FLOAT64)
        return op == O_SUM || op == O_PROD;
    if (dtype == D_COMPLEX64 || dtype == D_COMPLEX128)
        return op == O_SUM;
    return 1;
}

static int divide(int dtype, char *out, const char *a, Py_ssize_t n, long divisor) {
    if (dtype == D_FLOAT32) {
        float *o = (float *)out, d = (float)divisor;
        const float *x = (const float *)a;
        for (Py_ssize_t i = 0; i < n; i++)
            o[i] = x[i] / d;
        return 0;
    }
    if (dtype == D_FLOAT64) {
        double *o = (double *)out, d = (double)divisor;
        const double *x = (const double *)a;
        for (Py_ssize_t i = 0; i < n; i++)
            o[i] = x[i] / d;
        return 0;
    }
    return -1;
}

/* supports(op, dtype): whether WORK_OP with these codes is done here (native.py asks). */
PyObject *supports(PyObject *module, PyObject *args) {
    int op, dtype;
    if (!PyArg_ParseTuple(args, "ii", &op, &dtype))
        return NULL;
    return PyBool_FromLong(op_supported(op, dtype));
}

/* 0: done; -1: a callable raised; 1: a layout differs from the one recorded (WORK_EXPECT). */
int do_work(const Program *p, const Work *work, Py_ssize_t n) {
    for (Py_ssize_t w = 0; w < n; w++) {
        const Work *k = &work[w];
        if (k->kind == WORK_EXPECT) {
            if (memcmp(address(p, k->out), k->expected, (size_t)k->n) != 0)
                return 1;
        } else if (k->kind == WORK_COPY) {
            char *to = address(p, k->out), *from = address(p, k->a);
            if (to != from) /* a copy onto itself: an in-place gather's own block (Program.own_offset) */
                memmove(to, from, (size_t)k->n);
        } else if (k->kind == WORK_OP) {
            op_loop(k->op, k->dtype, address(p, k->out), address(p, k->a), address(p, k->b), k->n);
        } else if (k->kind == WORK_DIVIDE) {
            divide(k->dtype, address(p, k->out), address(p, k->a), k->n, k->divisor);
        } else {
            PyObject *result = PyObject_CallNoArgs(k->callable);
            if (result == NULL)
                return -1;
            Py_DECREF(result);
        }
    }
    return 0;
}

/* ---- work from plain data ---- */

int parse_ref(PyObject *item, Ref *ref) {
    return PyArg_ParseTuple(item, "in", &ref->root, &ref->offset) ? 0 : -1;
}

int check_ref(const Ref *ref, Py_ssize_t nroots) {
    if (ref->root >= nroots || ref->root < -1) {
        PyErr_SetString(PyExc_ValueError, "a reference names no root of its program");
        return -1;
    }
    return 0;
}

/* Work from a tuple whose items are callables or (kind, op, dtype, out, a, b, n, divisor), each
   operand a (root, offset) pair. */
Work *work_init(PyObject *works, Py_ssize_t *n, Py_ssize_t nroots) {
    *n = PyTuple_GET_SIZE(works);
    Work *work = PyMem_Calloc(*n ? *n : 1, sizeof(Work));
    if (work == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t w = 0; w < *n; w++) {
        PyObject *item = PyTuple_GET_ITEM(works, w);
        Work *k = &work[w];
        if (!PyTuple_Check(item)) {
            k->kind = WORK_CALL;
            k->callable = item;
            continue;
        }
        PyObject *out, *a, *b, *expected = NULL;
        if (!PyArg_ParseTuple(item, "iiiOOOnl|O!", &k->kind, &k->op, &k->dtype, &out, &a, &b, &k->n, &k->divisor,
                              &PyBytes_Type, &expected) ||
            parse_ref(out, &k->out) < 0 || parse_ref(a, &k->a) < 0 || parse_ref(b, &k->b) < 0 ||
            check_ref(&k->out, nroots) < 0 || check_ref(&k->a, nroots) < 0 || check_ref(&k->b, nroots) < 0)
            goto fail;
        if (expected != NULL)
            k->expected = PyBytes_AS_STRING(expected);
        if ((k->kind == WORK_OP && !op_supported(k->op, k->dtype)) ||
            (k->kind == WORK_DIVIDE && k->dtype != D_FLOAT32 && k->dtype != D_FLOAT64) ||
            (k->kind == WORK_EXPECT && (expected == NULL || PyBytes_GET_SIZE(expected) != k->n)) ||
            k->kind < WORK_COPY || k->kind > WORK_EXPECT || k->n < 0) {
            PyErr_SetString(PyExc_ValueError, "work this program cannot do");
            goto fail;
        }
    }
    return work;
fail:
    PyMem_Free(work);
    return NULL;
}
