/*
 * The compiled replay of a plan's exchanges (wrapped by mpiring/engine/compiled.py).
 *
 *   per exchange:  MPI_Startall ─► copies in flight ─► MPI_Waitall, or MPI_Testall spun for `spin` s
 *                  └──────────── the plan's persistent requests ────────────┘
 *                  ─► byte counts ─► work() (recorded callables)
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
    PyObject *during_works;    /* as Python gave it */
    Py_ssize_t nduring;
    Work *during;              /* run once its messages are started, before waiting for them */
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
        PyMem_Free(e->during);
        PyMem_Free(e->fresh);
        Py_XDECREF(e->works);
        Py_XDECREF(e->during_works);
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
   bytes, dest, tag, request object's handle address), the last requests, during: work as `works`,
   done while its messages are in flight). */
static int exchange_init(Exchange *e, PyObject *spec) {
    PyObject *handles, *status_objects, *checks, *works, *fresh, *during;
    if (!PyArg_ParseTuple(spec, "O!O!O!O!O!O!", &PyBytes_Type, &handles, &PyTuple_Type, &status_objects,
                          &PyTuple_Type, &checks, &PyTuple_Type, &works, &PyTuple_Type, &fresh, &PyTuple_Type,
                          &during))
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
    if (e->work == NULL)
        return -1;
    Py_INCREF(during);
    e->during_works = during;
    e->during = work_init(during, &e->nduring);
    return e->during == NULL ? -1 : 0;
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
static PyObject *run_from(Program *self, Py_ssize_t first, int started, double spin) {
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
            if (do_work(e->during, e->nduring) < 0) {  /* a host copy (plan.fuse): it does not fail */
                mirror(e, 1);
                return NULL;
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
    return run_from(self, first, started, spin);
}

/* start(index): start exchange `index` (for Python, which then does its work in flight and waits for it);
   the MPI error code, 0 if none. */
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
   start): the prologue, then exchange 0 started and its work in flight done; the MPI error code, 0 if none. */
static int begin(Program *self) {  /* the MPI error code; -1 if work raised */
    if (do_work(self->prologue_work, self->nprologue) < 0)
        return -1;
    if (self->length == 0)
        return 0;
    Exchange *e = &self->exchanges[0];
    int code = start_exchange(e, self->comm);
    mirror(e, 1);
    if (!code && do_work(e->during, e->nduring) < 0)
        return -1;
    return code;
}

static PyObject *program_begin(Program *self, PyObject *unused) {
    if (self->exchanges == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this program was released");
        return NULL;
    }
    int code = begin(self);
    return code < 0 ? NULL : PyLong_FromLong(code);
}

static PyObject *program_release(Program *self, PyObject *unused) {
    program_clear(self);
    Py_RETURN_NONE;
}

static PyMethodDef program_methods[] = {
    {"run", (PyCFunction)(void (*)(void))program_run, METH_FASTCALL,
     "run(first, started, spin): None when done, else (exchange, reason, MPI error code)"},
    {"start", (PyCFunction)program_start, METH_O, "start(index): start one exchange; the MPI error code"},
    {"begin", (PyCFunction)program_begin, METH_NOARGS, "begin(): the prologue, then exchange 0 started (and its work in flight done); the MPI error code"},
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
    .tp_doc = "A plan replayed in C: Program(prologue, ((handles, status_objects, checks, works, fresh, during), ...), "
               "comm, busy=False); work: callables, or (kind, out, a, b, bytes) for copies and float sums",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)program_init,
    .tp_dealloc = (destructor)program_dealloc,
    .tp_methods = program_methods,
    .tp_members = program_members,
};

/*
 * A blocking call whose plan is cached, taken without running Python (communicator.py, `_blocking`).
 *
 *   comm.allreduce(x, out=y) ─► Shortcut(collective, x, out, op, root, counts, algorithm, timeout)
 *       a compiled host plan under the call's key, the same arrays' shapes and dtypes, the
 *       owner thread, nothing in flight, no per-call timeout (and no MPIRING_CHECK: not made then)
 *           yes ─► the call count and traffic, as Python counts them ─► run ─► the plan's result
 *                      └── stopped or raised ─► after(plan, stopped, spin, error): Python carries on
 *           no  ─► in_python(the same arguments): the whole call, as if this were not here
 *
 * It makes the decisions the Python hit path makes, on the same objects, and changes nothing
 * before it has decided: any doubt (an error while looking) is a miss, and Python decides again.
 * A generic attribute lookup costs about as much as the Python it would replace, so the plan's
 * and the traffic counters' fields (__slots__) are read and written at offsets found once, when
 * the shortcut is made; the ring's in-flight list and traffic are objects it is never given anew.
 * The key's tuple and its dict lookup are most of what is left, so the last hit is remembered:
 * the very same arguments, with no plan removed from the cache since (PlanCache.removals), find
 * the same plan without them.
 */
enum { P_COMPILED, P_BACKEND, P_X_SHAPE, P_X_DTYPE, P_OUT_SHAPE, P_OUT_DTYPE, P_USED, P_TRAFFIC, P_RESULT,
       P_COPY_RESULT, PLAN_FIELDS };
static const char *plan_fields[PLAN_FIELDS] = {"compiled", "backend", "x_shape", "x_dtype", "out_shape",
                                               "out_dtype", "used", "traffic", "result", "copy_result"};
static const char *traffic_fields[3] = {"bytes_sent", "bytes_received", "messages"};
enum { KEY_ARGS = 7 }; /* collective, x, out, op, root, counts, algorithm: what the key is made of */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *cache;        /* the communicator's PlanCache: its removals date the memo */
    PyObject *table;        /* its plans by key (cache.table, never replaced) */
    PyObject *ring;         /* its Ring: owner and calls */
    PyObject *in_flight;    /* ring.in_flight */
    PyObject *traffic;      /* ring.traffic */
    PyObject *communicator; /* its timeout */
    PyObject *plan_type;    /* Plan: a Sighting is a miss */
    PyObject *host;         /* the NumPy backend: a device plan is a miss */
    PyObject *in_python;    /* the call in Python */
    PyObject *after;        /* where Python takes over a run that stopped or raised */
    double yield_seconds;   /* the longest spin before Python's waiting.poll takes over */
    Py_ssize_t plan_at[PLAN_FIELDS], traffic_at[3]; /* the fields' offsets in a Plan and a Traffic */
    Py_ssize_t removals_at; /* and of cache.removals */
    /* the last hit: its key's arguments (held, so none can be another object at the same address),
       its plan, and cache.removals then; while no plan has left the cache since, the same
       arguments find the same plan without the key's tuple and the dict (most calls repeat one) */
    PyObject *memo[KEY_ARGS], *memo_plan;
    long long memo_removals;
} Shortcut;

static PyObject *s_owner, *s_shape, *s_dtype, *s_timeout, *s_calls, *one;

/* Where instances of `type` keep the __slots__ field `name`; -1 with an error if it is not one. */
static Py_ssize_t slot_offset(PyTypeObject *type, const char *name) {
    PyObject *descriptor = PyObject_GetAttrString((PyObject *)type, name);
    Py_ssize_t offset = -1;
    if (descriptor != NULL && Py_TYPE(descriptor) == &PyMemberDescr_Type &&
        ((PyMemberDescrObject *)descriptor)->d_member->type == T_OBJECT_EX)
        offset = ((PyMemberDescrObject *)descriptor)->d_member->offset;
    else if (descriptor != NULL)
        PyErr_Format(PyExc_TypeError, "%s.%s is not a __slots__ field", type->tp_name, name);
    Py_XDECREF(descriptor);
    return offset;
}

/* The offsets of the __slots__ fields `names` in instances of `type`; -1 with an error if one is not. */
static int offsets_of(PyTypeObject *type, const char **names, int n, Py_ssize_t *at) {
    for (int i = 0; i < n; i++)
        if ((at[i] = slot_offset(type, names[i])) < 0)
            return -1;
    return 0;
}

#define FIELD(object, offset) (*(PyObject **)((char *)(object) + (offset))) /* borrowed; NULL if unset */

static void set_field(PyObject *object, Py_ssize_t offset, PyObject *value) {
    Py_XSETREF(FIELD(object, offset), Py_NewRef(value));
}

/* The exception being raised, with its traceback, taken (a new reference; the error indicator is clear). */
static PyObject *caught(void) {
    PyObject *type, *error, *traceback;
    PyErr_Fetch(&type, &error, &traceback);
    PyErr_NormalizeException(&type, &error, &traceback);
    if (error != NULL && traceback != NULL)
        PyException_SetTraceback(error, traceback);
    Py_XDECREF(type);
    Py_XDECREF(traceback);
    return error;
}

/* total += once, field by field (two Traffic objects; `at`: their fields' offsets). */
static int add_traffic(PyObject *total, PyObject *once, const Py_ssize_t *at) {
    if (once == NULL || Py_TYPE(once) != Py_TYPE(total)) {
        PyErr_SetString(PyExc_TypeError, "a plan's traffic is not a Traffic");
        return -1;
    }
    for (int i = 0; i < 3; i++) {
        PyObject *sum_so_far = FIELD(total, at[i]), *amount = FIELD(once, at[i]);
        PyObject *sum = sum_so_far && amount ? PyNumber_Add(sum_so_far, amount) : NULL;
        if (sum == NULL) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_AttributeError, "a Traffic field is unset");
            return -1;
        }
        set_field(total, at[i], sum);
        Py_DECREF(sum);
    }
    return 0;
}

/* ring.calls += 1; the new count (a new reference), NULL on an error. */
static PyObject *next_call(PyObject *ring) {
    PyObject *calls = PyObject_GetAttr(ring, s_calls), *now = NULL;
    if (calls != NULL) {
        now = PyNumber_Add(calls, one);
        Py_DECREF(calls);
    }
    if (now != NULL && PyObject_SetAttr(ring, s_calls, now) < 0)
        Py_CLEAR(now);
    return now;
}

/* 1: the calling thread is the ring's owner (Ring.claim); 0: not, or not readable (no error set). */
static int owned(PyObject *ring) {
    PyObject *owner = PyObject_GetAttr(ring, s_owner);
    int mine = owner != NULL && PyLong_Check(owner) && PyLong_AsUnsignedLong(owner) == PyThread_get_thread_ident();
    Py_XDECREF(owner);
    PyErr_Clear();
    return mine;
}

/* 1: `array` (None or an array) has the plan's shape and dtype for it; 0: not, or not readable. */
static int matches(PyObject *array, PyObject *want_shape, PyObject *want_dtype) {
    if (array == Py_None)
        return 1;
    if (want_shape == NULL || want_dtype == NULL)
        return 0;
    PyObject *shape = PyObject_GetAttr(array, s_shape), *dtype = PyObject_GetAttr(array, s_dtype);
    int same = shape && dtype && dtype == want_dtype && PyObject_RichCompareBool(shape, want_shape, Py_EQ) == 1;
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    return same;
}

static void forget(Shortcut *self) {
    for (int i = 0; i < KEY_ARGS; i++)
        Py_CLEAR(self->memo[i]);
    Py_CLEAR(self->memo_plan);
}

/* cache.removals; -1 if it is not a count (then no memo holds). Sets no error: it runs with one pending. */
static long long removals_now(Shortcut *self) {
    PyObject *removals = FIELD(self->cache, self->removals_at);
    int overflow = 1;
    long long now = removals && PyLong_CheckExact(removals) ? PyLong_AsLongLongAndOverflow(removals, &overflow) : -1;
    return overflow || now < 0 ? -1 : now;
}

/* Drop a memo whose plan may have left the cache (after each call: nor does it keep the arrays alive longer). */
static void forget_if_stale(Shortcut *self) {
    if (self->memo_plan != NULL && removals_now(self) != self->memo_removals)
        forget(self);
}

/* The plan the last hit found, if these are its arguments and no plan has left the cache since (borrowed). */
static PyObject *remembered(Shortcut *self, PyObject *const *args, long long removals) {
    if (self->memo_plan == NULL || removals != self->memo_removals)
        return NULL;
    for (int i = 0; i < KEY_ARGS; i++)
        if (args[i] != self->memo[i])
            return NULL;
    return self->memo_plan;
}

static void remember(Shortcut *self, PyObject *const *args, PyObject *plan, long long removals) {
    for (int i = 0; i < KEY_ARGS; i++)
        Py_XSETREF(self->memo[i], Py_NewRef(args[i]));
    Py_XSETREF(self->memo_plan, Py_NewRef(plan));
    self->memo_removals = removals;
}

/* The plan this call may run (borrowed: the table or the memo holds it), its program and its spin; NULL: a miss. */
static PyObject *hit(Shortcut *self, PyObject *const *args, Program **program, double *spin) {
    PyObject *x = args[1], *out = args[2];
    if (args[7] != Py_None || PyList_GET_SIZE(self->in_flight))  /* Python checks a per-call timeout */
        return NULL;
    long long removals = removals_now(self);
    if (removals < 0)
        return NULL;
    PyObject *plan = remembered(self, args, removals);
    if (plan == NULL) {
        PyObject *x_id = PyLong_FromVoidPtr(x), *out_id = PyLong_FromVoidPtr(out);
        PyObject *key = x_id && out_id ? PyTuple_Pack(KEY_ARGS, args[0], x_id, out_id, args[3], args[4], args[5],
                                                      args[6]) : NULL;
        Py_XDECREF(x_id);
        Py_XDECREF(out_id);
        if (key == NULL)
            return NULL;
        plan = PyDict_GetItemWithError(self->table, key);  /* unhashable op or counts: an error, a miss */
        Py_DECREF(key);
        if (plan == NULL || Py_TYPE(plan) != (PyTypeObject *)self->plan_type)
            return NULL;
        remember(self, args, plan, removals);
    }
    const Py_ssize_t *at = self->plan_at;
    PyObject *compiled = FIELD(plan, at[P_COMPILED]);
    if (compiled == NULL || Py_TYPE(compiled) != &ProgramType || ((Program *)compiled)->exchanges == NULL ||
        FIELD(plan, at[P_BACKEND]) != self->host)
        return NULL;
    if (!matches(x, FIELD(plan, at[P_X_SHAPE]), FIELD(plan, at[P_X_DTYPE])) ||
        !matches(out, FIELD(plan, at[P_OUT_SHAPE]), FIELD(plan, at[P_OUT_DTYPE])))
        return NULL;
    PyObject *timeout = owned(self->ring) ? PyObject_GetAttr(self->communicator, s_timeout) : NULL;
    if (timeout == NULL)
        return NULL;
    *spin = -1.0;
    if (timeout != Py_None) {
        double seconds = PyFloat_AsDouble(timeout);
        *spin = seconds < self->yield_seconds ? seconds : self->yield_seconds;
    }
    Py_DECREF(timeout);
    if (PyErr_Occurred())
        return NULL;
    *program = (Program *)compiled;
    return plan;
}

/* ring.calls = plan.used = ring.calls + 1, and ring.traffic += plan.traffic, as the Python hit path does. */
static int count_call(Shortcut *self, PyObject *plan) {
    PyObject *now = next_call(self->ring);
    if (now == NULL)
        return -1;
    set_field(plan, self->plan_at[P_USED], now);
    Py_DECREF(now);
    return add_traffic(self->traffic, FIELD(plan, self->plan_at[P_TRAFFIC]), self->traffic_at);
}

static PyObject *shortcut_call(Shortcut *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    double spin = -1.0;
    Program *program = NULL;
    PyObject *plan = NULL, *result = NULL;
    if (self->in_python == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Shortcut called before it was made (__init__)");
        return NULL;
    }
    if (PyVectorcall_NARGS(nargsf) == 8 && kwnames == NULL) {
        plan = hit(self, args, &program, &spin);
        PyErr_Clear();
    }
    if (plan == NULL) {
        result = PyObject_Vectorcall(self->in_python, args, nargsf, kwnames);
        forget_if_stale(self);
        return result;
    }
    Py_INCREF(plan);
    Py_INCREF(program);  /* a work callable could drop both from the table */
    PyObject *stopped = count_call(self, plan) == 0 ? run_from(program, 0, 0, spin) : NULL;
    if (stopped == Py_None) {
        PyObject *value = FIELD(plan, self->plan_at[P_RESULT]), *copy = FIELD(plan, self->plan_at[P_COPY_RESULT]);
        if (value == NULL || copy == NULL)
            PyErr_SetString(PyExc_AttributeError, "a plan's result is unset");
        else
            result = copy == Py_None ? Py_NewRef(value) : PyObject_CallOneArg(copy, value);
    } else {
        PyObject *error = stopped == NULL ? caught() : NULL; /* recorded work raised: Python raises it */
        PyObject *spin_object = PyFloat_FromDouble(spin);
        if (spin_object != NULL)
            result = PyObject_CallFunctionObjArgs(self->after, plan, stopped ? stopped : Py_None, spin_object,
                                                  error ? error : Py_None, NULL);
        Py_XDECREF(spin_object);
        Py_XDECREF(error);
    }
    Py_XDECREF(stopped);
    Py_DECREF(program);
    Py_DECREF(plan);
    forget_if_stale(self);  /* work or Python's after() may have cleared the cache */
    return result;
}

static int shortcut_init(Shortcut *self, PyObject *args, PyObject *kwds) {
    PyObject *cache, *ring, *communicator, *plan_type, *host, *in_python, *after;
    double yield_seconds;
    static char *names[] = {"cache", "ring", "communicator", "plan_type", "host", "in_python", "after",
                            "yield_seconds", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO!OOOd", names, &cache, &ring, &communicator, &PyType_Type,
                                     &plan_type, &host, &in_python, &after, &yield_seconds))
        return -1;
    PyObject *table = PyObject_GetAttrString(cache, "table");
    PyObject *in_flight = table ? PyObject_GetAttrString(ring, "in_flight") : NULL;
    PyObject *traffic = in_flight ? PyObject_GetAttrString(ring, "traffic") : NULL;
    if (traffic == NULL || !PyDict_CheckExact(table) || !PyList_CheckExact(in_flight)) {
        if (traffic != NULL)
            PyErr_SetString(PyExc_TypeError, "cache.table must be a dict and ring.in_flight a list");
        Py_XDECREF(table);
        Py_XDECREF(in_flight);
        Py_XDECREF(traffic);
        return -1;
    }
    if ((self->removals_at = slot_offset(Py_TYPE(cache), "removals")) < 0)
        goto fail;
    if (offsets_of((PyTypeObject *)plan_type, plan_fields, PLAN_FIELDS, self->plan_at) < 0 ||
        offsets_of(Py_TYPE(traffic), traffic_fields, 3, self->traffic_at) < 0)
        goto fail;
    PyObject **slots[] = {&self->cache, &self->table, &self->ring, &self->in_flight, &self->traffic,
                          &self->communicator, &self->plan_type, &self->host, &self->in_python, &self->after};
    PyObject *given[] = {cache, table, ring, in_flight, traffic, communicator, plan_type, host, in_python, after};
    for (int i = 0; i < 10; i++)
        Py_XSETREF(*slots[i], Py_NewRef(given[i]));
    forget(self);
    self->yield_seconds = yield_seconds;
    Py_DECREF(table);
    Py_DECREF(in_flight);
    Py_DECREF(traffic);
    return 0;
fail:
    Py_DECREF(table);
    Py_DECREF(in_flight);
    Py_DECREF(traffic);
    return -1;
}

static int shortcut_traverse(Shortcut *self, visitproc visit, void *arg) {
    Py_VISIT(self->cache);
    Py_VISIT(self->table);
    Py_VISIT(self->ring);
    Py_VISIT(self->in_flight);
    Py_VISIT(self->traffic);
    Py_VISIT(self->communicator);
    Py_VISIT(self->plan_type);
    Py_VISIT(self->host);
    Py_VISIT(self->in_python);
    Py_VISIT(self->after);
    for (int i = 0; i < KEY_ARGS; i++)
        Py_VISIT(self->memo[i]);
    Py_VISIT(self->memo_plan);
    return 0;
}

static int shortcut_clear(Shortcut *self) {
    forget(self);
    Py_CLEAR(self->cache);
    Py_CLEAR(self->table);
    Py_CLEAR(self->ring);
    Py_CLEAR(self->in_flight);
    Py_CLEAR(self->traffic);
    Py_CLEAR(self->communicator);
    Py_CLEAR(self->plan_type);
    Py_CLEAR(self->host);
    Py_CLEAR(self->in_python);
    Py_CLEAR(self->after);
    return 0;
}

static void shortcut_dealloc(Shortcut *self) {
    PyObject_GC_UnTrack(self);
    shortcut_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *shortcut_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    Shortcut *self = (Shortcut *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->vectorcall = (vectorcallfunc)shortcut_call;
    return (PyObject *)self;
}

static PyTypeObject ShortcutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpiring.engine._replay.Shortcut",
    .tp_basicsize = sizeof(Shortcut),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "Shortcut(cache, ring, communicator, plan_type, host, in_python, after, yield_seconds): a blocking "
              "call's cache hit run in C; called with in_python's arguments (collective, x, out, op, root, counts, "
              "algorithm, timeout)",
    .tp_new = shortcut_new,
    .tp_init = (initproc)shortcut_init,
    .tp_dealloc = (destructor)shortcut_dealloc,
    .tp_traverse = (traverseproc)shortcut_traverse,
    .tp_clear = (inquiry)shortcut_clear,
    .tp_vectorcall_offset = offsetof(Shortcut, vectorcall),
    .tp_call = PyVectorcall_Call,
};


/*
 * A persistent request's start() and wait() in C (executor.PersistentRequest, compiled.persistent_shortcut).
 *
 *   req.start() ─► the communicator usable, the owner thread, nothing in flight, the request free
 *                  to start, its program live (and no MPIRING_CHECK: not made then)
 *       yes ─► the call count and traffic ─► the prologue, exchange 0 started ─► in flight
 *                  └── an MPI error or raising work ─► failed_start(code or error): Python raises
 *       no  ─► start_in_python()
 *   req.wait() ─► started, no error, and complete or alone in flight, from the owner thread
 *       yes ─► the rest of the run ─► the plan's result
 *                  └── stopped waiting, a wrong size, an MPI error ─► resume_wait(stopped)
 *       no  ─► wait_in_python()
 *
 * As the Shortcut does for a blocking call: the same decisions and state changes as the Python
 * methods' lean paths, the request's, plan's and call's fields at slot offsets found once.
 */
enum { R_FREED, R_RUNNING, R_ERROR, R_POSITION, R_RUN, REQUEST_FIELDS };
static const char *request_fields[REQUEST_FIELDS] = {"_freed", "_running", "_error", "_position", "_run"};
enum { IN_PYTHON_START, IN_PYTHON_WAIT, FAILED_START, RESUME_WAIT, HANDLERS };
static const char *handler_names[HANDLERS] = {"_start_in_python", "_wait_in_python", "_failed_start", "_resume_wait"};

typedef struct {
    PyObject_HEAD
    PyObject *request, *communicator, *ring, *in_flight, *traffic, *plan, *program, *call;
    PyObject *handlers[HANDLERS]; /* the request's own methods, bound */
    double spin;                  /* as PersistentRequest._spin */
    Py_ssize_t request_at[REQUEST_FIELDS], traffic_at[3], plan_traffic_at, plan_result_at, step_at;
} Persistent;

static PyObject *s_freed, *s_broken, *zero;

/* The communicator not freed and its ring not broken (Communicator._usable); 0 also if unreadable. */
static int usable(Persistent *self) {
    PyObject *freed = PyObject_GetAttr(self->communicator, s_freed);
    PyObject *broken = freed == Py_False ? PyObject_GetAttr(self->ring, s_broken) : NULL;
    int yes = broken == Py_None;
    Py_XDECREF(freed);
    Py_XDECREF(broken);
    PyErr_Clear();
    return yes;
}

static PyObject *in_python(Persistent *self, int which) {
    return PyObject_CallNoArgs(self->handlers[which]);
}

/* 1: made (__init__ succeeded); 0 with an error: start() and wait() before it would find no request. */
static int made(Persistent *self) {
    if (self->request == NULL)
        PyErr_SetString(PyExc_RuntimeError, "a PersistentShortcut used before it was made (__init__)");
    return self->request != NULL;
}

static PyObject *persistent_start(Persistent *self, PyObject *unused) {
    if (!made(self))
        return NULL;
    PyObject *request = self->request;
    const Py_ssize_t *at = self->request_at;
    Program *program = (Program *)self->program;
    if (FIELD(request, at[R_FREED]) != Py_False || FIELD(request, at[R_RUNNING]) != Py_False ||
        PyList_GET_SIZE(self->in_flight) || program->exchanges == NULL || !usable(self) || !owned(self->ring))
        return in_python(self, IN_PYTHON_START);
    PyObject *now = next_call(self->ring);
    if (now == NULL)
        return NULL;
    Py_DECREF(now);
    set_field(self->call, self->step_at, zero);
    set_field(request, at[R_RUNNING], Py_True);
    set_field(request, at[R_ERROR], Py_None);
    if (add_traffic(self->traffic, FIELD(self->plan, self->plan_traffic_at), self->traffic_at) < 0)
        return NULL;
    set_field(request, at[R_POSITION], zero);
    int code = begin(program);
    if (code) {
        PyObject *failure = code < 0 ? caught() : PyLong_FromLong(code);
        PyObject *result = failure ? PyObject_CallOneArg(self->handlers[FAILED_START], failure) : NULL;
        Py_XDECREF(failure);
        return result;
    }
    if (program->length == 0)
        set_field(request, at[R_RUNNING], Py_False);
    else if (PyList_Append(self->in_flight, request) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *persistent_wait(Persistent *self, PyObject *unused) {
    if (!made(self))
        return NULL;
    PyObject *request = self->request;
    const Py_ssize_t *at = self->request_at;
    Program *program = (Program *)self->program;
    PyObject *position_object = FIELD(request, at[R_POSITION]), *running = FIELD(request, at[R_RUNNING]);
    int overflow = 1;
    long long position = position_object && PyLong_CheckExact(position_object)
                             ? PyLong_AsLongLongAndOverflow(position_object, &overflow) : -1;
    if (overflow || position < 0 || FIELD(request, at[R_ERROR]) != Py_None || FIELD(request, at[R_RUN]) != Py_None ||
        (running != Py_True && running != Py_False))
        return in_python(self, IN_PYTHON_WAIT);
    if (running == Py_True) {
        if (PyList_GET_SIZE(self->in_flight) != 1 || PyList_GET_ITEM(self->in_flight, 0) != request ||
            program->exchanges == NULL || !owned(self->ring))
            return in_python(self, IN_PYTHON_WAIT);
        if (PyList_SetSlice(self->in_flight, 0, 1, NULL) < 0)
            return NULL;
        set_field(request, at[R_RUNNING], Py_False);
        PyObject *stopped = run_from(program, (Py_ssize_t)position, 1, self->spin);
        if (stopped == NULL)  /* recorded work raised: as in Python, the error goes to the caller */
            return NULL;
        if (stopped != Py_None) {
            PyObject *result = PyObject_CallOneArg(self->handlers[RESUME_WAIT], stopped);
            Py_DECREF(stopped);
            return result;
        }
        Py_DECREF(stopped);
    }
    PyObject *result = FIELD(self->plan, self->plan_result_at);
    if (result == NULL)
        PyErr_SetString(PyExc_AttributeError, "a plan's result is unset");
    return Py_XNewRef(result);
}

static int persistent_init(Persistent *self, PyObject *args, PyObject *kwds) {
    PyObject *request, *communicator, *ring, *plan;
    double spin;
    static char *names[] = {"request", "communicator", "ring", "plan", "spin", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOd", names, &request, &communicator, &ring, &plan, &spin))
        return -1;
    PyObject *program = PyObject_GetAttrString(plan, "compiled");
    PyObject *call = program ? PyObject_GetAttrString(plan, "call") : NULL;
    PyObject *in_flight = call ? PyObject_GetAttrString(ring, "in_flight") : NULL;
    PyObject *traffic = in_flight ? PyObject_GetAttrString(ring, "traffic") : NULL;
    PyObject *handlers[HANDLERS] = {NULL};
    int ok = traffic != NULL;
    if (ok && (Py_TYPE(program) != &ProgramType || !PyList_CheckExact(in_flight))) {
        PyErr_SetString(PyExc_TypeError, "plan.compiled must be a Program and ring.in_flight a list");
        ok = 0;
    }
    ok = ok && offsets_of(Py_TYPE(request), request_fields, REQUEST_FIELDS, self->request_at) == 0 &&
         offsets_of(Py_TYPE(traffic), traffic_fields, 3, self->traffic_at) == 0 &&
         (self->plan_traffic_at = slot_offset(Py_TYPE(plan), "traffic")) >= 0 &&
         (self->plan_result_at = slot_offset(Py_TYPE(plan), "result")) >= 0 &&
         (self->step_at = slot_offset(Py_TYPE(call), "step")) >= 0;
    for (int i = 0; ok && i < HANDLERS; i++)
        ok = (handlers[i] = PyObject_GetAttrString(request, handler_names[i])) != NULL;
    if (ok) {
        PyObject **slots[] = {&self->request, &self->communicator, &self->ring, &self->in_flight, &self->traffic,
                              &self->plan, &self->program, &self->call};
        PyObject *given[] = {request, communicator, ring, in_flight, traffic, plan, program, call};
        for (int i = 0; i < 8; i++)
            Py_XSETREF(*slots[i], Py_NewRef(given[i]));
        for (int i = 0; i < HANDLERS; i++)
            Py_XSETREF(self->handlers[i], Py_NewRef(handlers[i]));
        self->spin = spin;
    }
    for (int i = 0; i < HANDLERS; i++)
        Py_XDECREF(handlers[i]);
    Py_XDECREF(program);
    Py_XDECREF(call);
    Py_XDECREF(in_flight);
    Py_XDECREF(traffic);
    return ok ? 0 : -1;
}

static int persistent_traverse(Persistent *self, visitproc visit, void *arg) {
    PyObject *held[] = {self->request, self->communicator, self->ring, self->in_flight, self->traffic, self->plan,
                        self->program, self->call};
    for (int i = 0; i < 8; i++)
        Py_VISIT(held[i]);
    for (int i = 0; i < HANDLERS; i++)
        Py_VISIT(self->handlers[i]);
    return 0;
}

static int persistent_clear(Persistent *self) {
    PyObject **held[] = {&self->request, &self->communicator, &self->ring, &self->in_flight, &self->traffic,
                         &self->plan, &self->program, &self->call};
    for (int i = 0; i < 8; i++)
        Py_CLEAR(*held[i]);
    for (int i = 0; i < HANDLERS; i++)
        Py_CLEAR(self->handlers[i]);
    return 0;
}

static void persistent_dealloc(Persistent *self) {
    PyObject_GC_UnTrack(self);
    persistent_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef persistent_methods[] = {
    {"start", (PyCFunction)persistent_start, METH_NOARGS, "Begin a run (the previous one must have completed)."},
    {"wait", (PyCFunction)persistent_wait, METH_NOARGS, "Block until the run started last completes; return its result."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PersistentType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpiring.engine._replay.PersistentShortcut",
    .tp_basicsize = sizeof(Persistent),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "PersistentShortcut(request, communicator, ring, plan, spin): a planned persistent request's "
              "start() and wait() in C where its lean path holds, else its own methods",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)persistent_init,
    .tp_dealloc = (destructor)persistent_dealloc,
    .tp_traverse = (traverseproc)persistent_traverse,
    .tp_clear = (inquiry)persistent_clear,
    .tp_methods = persistent_methods,
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

static int intern_names(void) {
    return (s_owner = PyUnicode_InternFromString("owner")) && (s_shape = PyUnicode_InternFromString("shape")) &&
                   (s_dtype = PyUnicode_InternFromString("dtype")) &&
                   (s_timeout = PyUnicode_InternFromString("timeout")) && (s_calls = PyUnicode_InternFromString("calls")) &&
                   (s_freed = PyUnicode_InternFromString("_freed")) &&
                   (s_broken = PyUnicode_InternFromString("broken")) && (one = PyLong_FromLong(1)) &&
                   (zero = PyLong_FromLong(0))
               ? 0
               : -1;
}

PyMODINIT_FUNC PyInit__replay(void) {
    if (PyType_Ready(&ProgramType) < 0 || PyType_Ready(&ShortcutType) < 0 || PyType_Ready(&PersistentType) < 0 ||
        intern_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Program", (PyObject *)&ProgramType) < 0 ||
        PyModule_AddObjectRef(m, "Shortcut", (PyObject *)&ShortcutType) < 0 ||
        PyModule_AddObjectRef(m, "PersistentShortcut", (PyObject *)&PersistentType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
