/*
 * The compiled replay of a plan's exchanges (wrapped by mpiring/engine/compiled.py).
 *
 *   per exchange:  MPI_Startall ─► MPI_Waitall, or MPI_Testall spun for `spin` s ─► byte counts ─► work()
 *                  └───────────── the plan's persistent requests ─────────────┘    (recorded callables)
 *
 * A small planned call is mostly the cost of crossing from Python into MPI and back a few times
 * per exchange (docs/engine.md, "Where the microseconds"). This runs the same loop as
 * executor.run_exchanges, in C. Anything that needs words or judgement goes back to Python,
 * which carries on at the exchange where this stopped:
 *   - an exchange still incomplete after `spin` seconds (a timed call: waiting.poll takes over),
 *   - a receive that got another byte count than expected, or an MPI error (the statuses are
 *     copied into the plan's MPI.Status objects, so Python names the sender as it always does).
 * The recorded work is called as Python would call it, except plain contiguous copies and float32
 * or float64 sums, which compiled.py recognises and this does itself (the same IEEE additions,
 * element by element, as NumPy's: the results are bitwise the same).
 *
 * No MPI header is needed: the MPI functions come from the library mpi4py loaded, and the sizes
 * of a request, a status and a datatype handle from mpi4py, so one build serves MPICH and Open
 * MPI alike. The requests are the plan's persistent ones, made by mpi4py: their handles are
 * copied once, since starting or completing a persistent request does not change its handle.
 * A plan whose sends are made anew each run (Ring.persistent_sends false, under Open MPI) has
 * them made here with MPI_Isend; their handles change every run, so while Python holds the
 * exchange (before a run, after it stopped) they are mirrored in the plan's MPI.Request objects:
 * written there after every wait, read back when a run resumes an exchange Python started.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef int (*startall_fn)(int, void *);
typedef int (*testall_fn)(int, void *, int *, void *);
typedef int (*waitall_fn)(int, void *, void *);
typedef int (*get_count_int_fn)(const void *, int, int *);          /* MPICH: MPI_Datatype is an int */
typedef int (*get_count_pointer_fn)(const void *, void *, int *);   /* Open MPI: a pointer */
typedef int (*isend_int_fn)(const void *, int, int, int, int, int, void *);
typedef int (*isend_pointer_fn)(const void *, int, void *, int, int, void *, void *);

/* What `bind` was given: the MPI library's functions and its handle sizes. */
static struct {
    startall_fn startall;
    testall_fn testall;
    waitall_fn waitall;
    void *get_count;
    void *isend;
    intptr_t byte_type;
    Py_ssize_t request_size, status_size, datatype_size;
    int bound;
} mpi;

/* Why a run went back to Python: the tuple it returns is (exchange, reason, MPI error code). */
enum { STOPPED_WAITING = 0, STOPPED_SIZE = 1, STOPPED_ERROR = 2 };

/* A piece of recorded work: a Python callable, or one the Python side recognised as a plain
   contiguous copy or float sum, done here without a call into NumPy (compiled.py, `_work`). */
enum { WORK_CALL = 0, WORK_COPY = 1, WORK_ADD_FLOAT32 = 2, WORK_ADD_FLOAT64 = 3 };

typedef struct {
    int kind;
    PyObject *callable;        /* WORK_CALL (borrowed: the works tuple owns it) */
    char *out, *a, *b;         /* WORK_COPY: out <- a; WORK_ADD_*: out <- a + b */
    Py_ssize_t bytes;
} Work;

/* A send made anew by every run (MPI_Isend of `bytes` at `buf`): its request is requests[index],
   mirrored at `object`, where its MPI.Request object keeps its handle. */
typedef struct {
    int index, bytes, dest, tag;
    const char *buf;
    uintptr_t object;
} FreshSend;

typedef struct {
    int count;                 /* requests */
    int nfresh;                /* the last nfresh requests are sends made anew (`fresh`) */
    FreshSend *fresh;
    char *requests;            /* count handles, contiguous */
    char *statuses;            /* count statuses, contiguous */
    uintptr_t *status_objects; /* per request, where its MPI.Status object keeps its status (0: none) */
    int checks;                /* receives to check */
    int *check_index, *check_bytes;
    PyObject *works;           /* the work as Python gave it (it keeps the arrays alive) */
    Py_ssize_t nwork;
    Work *work;                /* run once the exchange is complete */
} Exchange;

typedef struct {
    PyObject_HEAD
    intptr_t comm;             /* the communicator's handle: the fresh sends go there */
    char busy;                 /* spin without offering the core (the node has a core per rank) */
    PyObject *prologue;        /* as Python gave it */
    Py_ssize_t nprologue;
    Work *prologue_work;       /* run before a run's first exchange */
    Py_ssize_t length;
    Exchange *exchanges;
} Program;

static int get_count(const void *status, int *count) {
    if (mpi.datatype_size == (Py_ssize_t)sizeof(int))
        return ((get_count_int_fn)mpi.get_count)(status, (int)mpi.byte_type, count);
    return ((get_count_pointer_fn)mpi.get_count)(status, (void *)mpi.byte_type, count);
}

static int isend(const FreshSend *f, intptr_t comm, void *request) {
    if (mpi.datatype_size == (Py_ssize_t)sizeof(int))
        return ((isend_int_fn)mpi.isend)(f->buf, f->bytes, (int)mpi.byte_type, f->dest, f->tag, (int)comm, request);
    return ((isend_pointer_fn)mpi.isend)(f->buf, f->bytes, (void *)mpi.byte_type, f->dest, f->tag, (void *)comm,
                                         request);
}

/* Start an exchange: its persistent requests, then its fresh sends. */
static int start_exchange(Exchange *e, intptr_t comm) {
    int code = 0;
    if (e->count > e->nfresh)
        code = mpi.startall(e->count - e->nfresh, e->requests);
    for (int i = 0; i < e->nfresh && !code; i++)
        code = isend(&e->fresh[i], comm, e->requests + e->fresh[i].index * mpi.request_size);
    return code;
}

/* The fresh sends' handles to (`out`) or from their MPI.Request objects. */
static void mirror(Exchange *e, int out) {
    for (int i = 0; i < e->nfresh; i++) {
        char *here = e->requests + e->fresh[i].index * mpi.request_size;
        void *there = (void *)e->fresh[i].object;
        if (out)
            memcpy(there, here, mpi.request_size);
        else
            memcpy(here, there, mpi.request_size);
    }
}

static double seconds_now(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + 1e-9 * (double)now.tv_nsec;
}

static int do_work(const Work *work, Py_ssize_t n) {
    for (Py_ssize_t w = 0; w < n; w++) {
        const Work *k = &work[w];
        if (k->kind == WORK_COPY) {
            memmove(k->out, k->a, (size_t)k->bytes);
        } else if (k->kind == WORK_ADD_FLOAT32) {
            float *out = (float *)k->out;
            const float *a = (const float *)k->a, *b = (const float *)k->b;
            for (Py_ssize_t i = 0; i < k->bytes / (Py_ssize_t)sizeof(float); i++)
                out[i] = a[i] + b[i];
        } else if (k->kind == WORK_ADD_FLOAT64) {
            double *out = (double *)k->out;
            const double *a = (const double *)k->a, *b = (const double *)k->b;
            for (Py_ssize_t i = 0; i < k->bytes / (Py_ssize_t)sizeof(double); i++)
                out[i] = a[i] + b[i];
        } else {
            PyObject *result = PyObject_CallNoArgs(k->callable);
            if (result == NULL)
                return -1;
            Py_DECREF(result);
        }
    }
    return 0;
}

static void *address_of(PyObject *number) {
    return number == Py_None ? NULL : PyLong_AsVoidPtr(number);
}

/* Work from a tuple whose items are callables or (kind, out, a, b, bytes, callable), addresses as ints. */
static Work *work_init(PyObject *works, Py_ssize_t *n) {
    *n = PyTuple_GET_SIZE(works);
    Work *work = PyMem_Calloc(*n ? *n : 1, sizeof(Work));
    if (work == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t w = 0; w < *n; w++) {
        PyObject *item = PyTuple_GET_ITEM(works, w);
        if (!PyTuple_Check(item)) {
            work[w].kind = WORK_CALL;
            work[w].callable = item;
            continue;
        }
        PyObject *out, *a, *b;
        PyObject *owner; /* the recorded callable: its arrays live as long as the works tuple */
        if (!PyArg_ParseTuple(item, "iOOOnO", &work[w].kind, &out, &a, &b, &work[w].bytes, &owner) ||
            work[w].kind < WORK_COPY || work[w].kind > WORK_ADD_FLOAT64) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "unknown kind of work");
            PyMem_Free(work);
            return NULL;
        }
        work[w].out = address_of(out);
        work[w].a = address_of(a);
        work[w].b = address_of(b);
        if (PyErr_Occurred()) {
            PyMem_Free(work);
            return NULL;
        }
    }
    return work;
}

static void program_clear(Program *self) {
    Py_CLEAR(self->prologue);
    PyMem_Free(self->prologue_work);
    self->prologue_work = NULL;
    self->nprologue = 0;
    if (self->exchanges == NULL)
        return;
    for (Py_ssize_t i = 0; i < self->length; i++) {
        Exchange *e = &self->exchanges[i];
        PyMem_Free(e->requests);
        PyMem_Free(e->statuses);
        PyMem_Free(e->status_objects);
        PyMem_Free(e->check_index);
        PyMem_Free(e->check_bytes);
        PyMem_Free(e->work);
        PyMem_Free(e->fresh);
        Py_XDECREF(e->works);
    }
    PyMem_Free(self->exchanges);
    self->exchanges = NULL;
    self->length = 0;
}

static void program_dealloc(Program *self) {
    program_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* One exchange from (handles: bytes, status_objects: tuple of int, checks: tuple of (index, bytes),
   works: tuple of callables or recognised work, see work_init, fresh: tuple of (index, address,
   bytes, dest, tag, request object's handle address), the last requests). */
static int exchange_init(Exchange *e, PyObject *spec) {
    PyObject *handles, *status_objects, *checks, *works, *fresh;
    if (!PyArg_ParseTuple(spec, "O!O!O!O!O!", &PyBytes_Type, &handles, &PyTuple_Type, &status_objects,
                          &PyTuple_Type, &checks, &PyTuple_Type, &works, &PyTuple_Type, &fresh))
        return -1;
    Py_ssize_t size = PyBytes_GET_SIZE(handles);
    if (size % mpi.request_size != 0 || PyTuple_GET_SIZE(status_objects) != size / mpi.request_size) {
        PyErr_SetString(PyExc_ValueError, "handles and status objects disagree");
        return -1;
    }
    e->count = (int)(size / mpi.request_size);
    e->checks = (int)PyTuple_GET_SIZE(checks);
    e->requests = PyMem_Malloc(size ? size : 1);
    e->statuses = PyMem_Calloc(e->count ? e->count : 1, mpi.status_size);
    e->status_objects = PyMem_Calloc(e->count ? e->count : 1, sizeof(uintptr_t));
    e->check_index = PyMem_Calloc(e->checks ? e->checks : 1, sizeof(int));
    e->check_bytes = PyMem_Calloc(e->checks ? e->checks : 1, sizeof(int));
    if (!e->requests || !e->statuses || !e->status_objects || !e->check_index || !e->check_bytes) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(e->requests, PyBytes_AS_STRING(handles), size);
    for (int i = 0; i < e->count; i++) {
        PyObject *address = PyTuple_GET_ITEM(status_objects, i);
        e->status_objects[i] = address == Py_None ? 0 : (uintptr_t)PyLong_AsUnsignedLongLong(address);
    }
    for (int i = 0; i < e->checks; i++) {
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(checks, i), "ii", &e->check_index[i], &e->check_bytes[i]))
            return -1;
        if (e->check_index[i] < 0 || e->check_index[i] >= e->count) {
            PyErr_SetString(PyExc_ValueError, "a check names no request of its exchange");
            return -1;
        }
    }
    e->nfresh = (int)PyTuple_GET_SIZE(fresh);
    e->fresh = PyMem_Calloc(e->nfresh ? e->nfresh : 1, sizeof(FreshSend));
    if (e->fresh == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < e->nfresh; i++) {
        FreshSend *f = &e->fresh[i];
        unsigned long long buf, object;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fresh, i), "iKiiiK", &f->index, &buf, &f->bytes, &f->dest, &f->tag,
                              &object))
            return -1;
        if (f->index != e->count - e->nfresh + i || f->bytes < 0 || !object) {
            PyErr_SetString(PyExc_ValueError, "fresh sends must be the exchange's last requests, in order");
            return -1;
        }
        f->buf = (const char *)(uintptr_t)buf;
        f->object = (uintptr_t)object;
    }
    if (PyErr_Occurred())
        return -1;
    Py_INCREF(works);
    e->works = works;
    e->work = work_init(works, &e->nwork);
    return e->work == NULL ? -1 : 0;
}

static int program_init(Program *self, PyObject *args, PyObject *kwds) {
    PyObject *prologue, *specs;
    unsigned long long comm;
    int busy = 0;
    static char *names[] = {"prologue", "exchanges", "comm", "busy", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!K|p", names, &PyTuple_Type, &prologue, &PyTuple_Type, &specs,
                                     &comm, &busy))
        return -1;
    if (!mpi.bound) {
        PyErr_SetString(PyExc_RuntimeError, "bind() the MPI library first");
        return -1;
    }
    program_clear(self);
    self->comm = (intptr_t)comm;
    self->busy = (char)busy;
    Py_INCREF(prologue);
    self->prologue = prologue;
    self->prologue_work = work_init(prologue, &self->nprologue);
    if (self->prologue_work == NULL)
        return -1;
    Py_ssize_t length = PyTuple_GET_SIZE(specs);
    self->exchanges = PyMem_Calloc(length ? length : 1, sizeof(Exchange));
    if (self->exchanges == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->length = length;
    for (Py_ssize_t i = 0; i < length; i++)
        if (exchange_init(&self->exchanges[i], PyTuple_GET_ITEM(specs, i)) < 0)
            return -1;
    return 0;
}

/* Hand exchange `index` back to Python; on a size or MPI error, its statuses go where Python reads them. */
static PyObject *stopped(const Exchange *e, Py_ssize_t index, int reason, int code) {
    if (reason != STOPPED_WAITING)
        for (int i = 0; i < e->count; i++)
            if (e->status_objects[i])
                memcpy((void *)e->status_objects[i], e->statuses + i * mpi.status_size, mpi.status_size);
    return Py_BuildValue("(nii)", index, reason, code);
}

/* run(first, started, spin): run exchanges first.. to the end (`started`: the first one's requests
   already are; a run from the very beginning, first 0 and not started, calls the prologue first). spin < 0: wait without a timeout (MPI_Waitall); else test for at most `spin` seconds,
   offering the core between tests unless `busy`, as waiting.poll does. Returns None when every exchange is done,
   else (exchange, reason, code): see the head of this file. */
static PyObject *program_run(Program *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "run(first, started, spin)");
        return NULL;
    }
    Py_ssize_t first = PyLong_AsSsize_t(args[0]);
    int started = PyObject_IsTrue(args[1]);
    double spin = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred())
        return NULL;
    if (self->exchanges == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this program was released");
        return NULL;
    }
    if (first == 0 && !started && do_work(self->prologue_work, self->nprologue) < 0)
        return NULL;
    for (Py_ssize_t index = first; index < self->length; index++) {
        Exchange *e = &self->exchanges[index];
        int code = 0, done = 0;
        if (index > first || !started) {
            code = start_exchange(e, self->comm);
            if (code) {
                mirror(e, 1);
                return stopped(e, index, STOPPED_ERROR, code);
            }
        } else {
            mirror(e, 0); /* Python started it, and may have seen some of its sends complete */
        }
        if (spin < 0) {
            Py_BEGIN_ALLOW_THREADS
            code = mpi.waitall(e->count, e->requests, e->statuses);
            Py_END_ALLOW_THREADS
            done = 1;
        } else {
            code = mpi.testall(e->count, e->requests, &done, e->statuses);
            if (!code && !done) {
                Py_BEGIN_ALLOW_THREADS
                double until = seconds_now() + spin;
                while (!code && !done && seconds_now() < until) {
                    if (!self->busy)
                        sched_yield();
                    code = mpi.testall(e->count, e->requests, &done, e->statuses);
                }
                Py_END_ALLOW_THREADS
            }
        }
        mirror(e, 1); /* done: null handles; else Python carries on with them */
        if (code)
            return stopped(e, index, STOPPED_ERROR, code);
        if (!done)
            return stopped(e, index, STOPPED_WAITING, 0);
        for (int i = 0; i < e->checks; i++) {
            int count = -1;
            code = get_count(e->statuses + e->check_index[i] * mpi.status_size, &count);
            if (code)
                return stopped(e, index, STOPPED_ERROR, code);
            if (count != e->check_bytes[i])
                return stopped(e, index, STOPPED_SIZE, 0);
        }
        if (do_work(e->work, e->nwork) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* start(index): start exchange `index` (for Python, which then waits for it); the MPI error code, 0 if none. */
static PyObject *program_start(Program *self, PyObject *index_object) {
    Py_ssize_t index = PyLong_AsSsize_t(index_object);
    if (PyErr_Occurred())
        return NULL;
    if (self->exchanges == NULL || index < 0 || index >= self->length) {
        PyErr_SetString(PyExc_IndexError, "no such exchange (or the program was released)");
        return NULL;
    }
    Exchange *e = &self->exchanges[index];
    int code = start_exchange(e, self->comm);
    mirror(e, 1);
    return PyLong_FromLong(code);
}

/* begin(): a run from the very beginning that Python will wait for (a persistent request's
   start): the prologue, then exchange 0 started; the MPI error code, 0 if none. */
static PyObject *program_begin(Program *self, PyObject *unused) {
    if (self->exchanges == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this program was released");
        return NULL;
    }
    if (do_work(self->prologue_work, self->nprologue) < 0)
        return NULL;
    if (self->length == 0)
        return PyLong_FromLong(0);
    Exchange *e = &self->exchanges[0];
    int code = start_exchange(e, self->comm);
    mirror(e, 1);
    return PyLong_FromLong(code);
}

static PyObject *program_release(Program *self, PyObject *unused) {
    program_clear(self);
    Py_RETURN_NONE;
}

static PyMethodDef program_methods[] = {
    {"run", (PyCFunction)(void (*)(void))program_run, METH_FASTCALL,
     "run(first, started, spin): None when done, else (exchange, reason, MPI error code)"},
    {"start", (PyCFunction)program_start, METH_O, "start(index): start one exchange; the MPI error code"},
    {"begin", (PyCFunction)program_begin, METH_NOARGS, "begin(): the prologue, then exchange 0 started; the MPI error code"},
    {"release", (PyCFunction)program_release, METH_NOARGS, "forget the handles (the plan freed its requests)"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef program_members[] = {
    {"busy", T_BOOL, offsetof(Program, busy), READONLY, "whether a spin tests without offering the core"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpiring.engine._replay.Program",
    .tp_basicsize = sizeof(Program),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A plan replayed in C: Program(prologue, ((handles, status_objects, checks, works, fresh), ...), "
               "comm, busy=False); work: callables, or (kind, out, a, b, bytes) for copies and float sums",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)program_init,
    .tp_dealloc = (destructor)program_dealloc,
    .tp_methods = program_methods,
    .tp_members = program_members,
};

/* bind(startall, testall, waitall, get_count, isend, request_size, status_size, datatype_size, byte_type);
   a communicator's handle has the datatype's size (compiled.py checks). */
static PyObject *bind(PyObject *module, PyObject *args) {
    unsigned long long startall, testall, waitall, count, isend_address, byte_type;
    Py_ssize_t request_size, status_size, datatype_size;
    if (!PyArg_ParseTuple(args, "KKKKKnnnK", &startall, &testall, &waitall, &count, &isend_address, &request_size,
                          &status_size, &datatype_size, &byte_type))
        return NULL;
    if (!startall || !testall || !waitall || !count || !isend_address || request_size <= 0 || status_size <= 0 ||
        (datatype_size != (Py_ssize_t)sizeof(int) && datatype_size != (Py_ssize_t)sizeof(void *))) {
        PyErr_SetString(PyExc_ValueError, "bind(): an MPI function is missing or a handle size is unknown");
        return NULL;
    }
    mpi.startall = (startall_fn)(uintptr_t)startall;
    mpi.testall = (testall_fn)(uintptr_t)testall;
    mpi.waitall = (waitall_fn)(uintptr_t)waitall;
    mpi.get_count = (void *)(uintptr_t)count;
    mpi.isend = (void *)(uintptr_t)isend_address;
    mpi.request_size = request_size;
    mpi.status_size = status_size;
    mpi.datatype_size = datatype_size;
    mpi.byte_type = (intptr_t)byte_type;
    mpi.bound = 1;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS, "bind(startall, testall, waitall, get_count, isend, request_size, status_size, "
                                 "datatype_size, byte_type): the MPI library's functions and handle sizes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_replay", "A plan's exchanges replayed in C (mpiring.engine.compiled).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__replay(void) {
    if (PyType_Ready(&ProgramType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&ProgramType);
    if (PyModule_AddObject(m, "Program", (PyObject *)&ProgramType) < 0) {
        Py_DECREF(&ProgramType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
