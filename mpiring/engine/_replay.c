/*
 * Schedules replayed in C (wrapped by mpiring/engine/native.py).
 *
 *   per exchange:  post its messages ─► copies in flight ─► MPI_Waitall, or MPI_Testall spun for `spin` s
 *                  ─► byte counts ─► work (copies and arithmetic on the bound buffers)
 *
 * A Program is plain data: per exchange, its messages as (root, offset, bytes, peer, tag) and its
 * work as (kind, op and dtype, operands as (root, offset), length). Roots 0 and 1 are the call's
 * x and out, bound anew by every call (`bind`, or the Shortcut); the others are buffers the
 * schedule owns. So one Program serves every call of its layout, whichever arrays it is given:
 * its messages are posted at base + offset each run, as an MPI library runs its own schedules.
 * Device plans, bound to their arrays for life, use the same type with persistent requests and
 * Python callables as work.
 *
 * Anything that needs words or judgement goes back to Python, which carries on at the exchange
 * where this stopped (run.py and schedule.py, the Python port of this loop):
 *   - an exchange still incomplete after `spin` seconds (a timed call: waiting.poll takes over),
 *   - a receive that got another byte count than expected, or an MPI error (the statuses are
 *     copied into the exchange's MPI.Status objects, so Python names the sender as it always does).
 * While Python holds an exchange its messages' handles live in the step's MPI.Request objects
 * (written there whenever C stops, read back when C resumes one Python started).
 *
 * Arithmetic done here is exactly NumPy's: integer wrap-around, IEEE single and double additions
 * and products one element at a time, bool and bitwise and logical ops giving 0 or 1. What could
 * round differently (float min and max with NaN and signed zeros, complex products and divisions,
 * float16) stays a call into NumPy.
 *
 * No MPI header is needed: the MPI functions come from the library mpi4py loaded, and the sizes
 * of a request, a status and a datatype handle from mpi4py, so one build serves MPICH and Open
 * MPI alike.
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
typedef int (*message_int_fn)(void *, int, int, int, int, int, void *);         /* MPI_Isend, MPI_Irecv */
typedef int (*message_pointer_fn)(void *, int, void *, int, int, void *, void *);
typedef int (*iprobe_int_fn)(int, int, int, int *, void *);                       /* MPI_Iprobe */
typedef int (*iprobe_pointer_fn)(int, int, void *, int *, void *);

/* What `bind` was given: the MPI library's functions and its handle sizes. */
static struct {
    startall_fn startall;
    testall_fn testall;
    waitall_fn waitall;
    void *get_count, *isend, *irecv, *iprobe;
    intptr_t byte_type;
    int any_source;
    Py_ssize_t request_size, status_size, datatype_size;
    Py_ssize_t request_offset; /* where an mpi4py Request object keeps its handle */
    int bound;
} mpi;

/* Why a run went back to Python: the tuple it returns is (exchange, reason, MPI error code). */
enum { STOPPED_WAITING = 0, STOPPED_SIZE = 1, STOPPED_ERROR = 2, STOPPED_CHANGED = 3, STOPPED_NOTICE = 4 };

/* Work: a Python callable, or what this file does itself (native.py, `work_spec`). WORK_EXPECT
   compares a layout just exchanged with the one the schedule was recorded for: another one stops
   the run (STOPPED_CHANGED), and Python finishes the call for that layout. */
enum { WORK_CALL = 0, WORK_COPY = 1, WORK_OP = 2, WORK_DIVIDE = 3, WORK_EXPECT = 4 };
/* dtypes and ops as native.py numbers them */
enum { D_BOOL, D_INT8, D_INT16, D_INT32, D_INT64, D_UINT8, D_UINT16, D_UINT32, D_UINT64, D_FLOAT32, D_FLOAT64,
       D_COMPLEX64, D_COMPLEX128, DTYPES };
enum { O_SUM, O_PROD, O_MIN, O_MAX, O_BAND, O_BOR, O_BXOR, O_LAND, O_LOR, O_LXOR, OPS };

typedef struct {
    int root;          /* -1: `offset` is an absolute address */
    Py_ssize_t offset; /* bytes from the root's start */
} Ref;

typedef struct {
    int kind, op, dtype;
    PyObject *callable; /* WORK_CALL (borrowed: the works tuple owns it) */
    Ref out, a, b;      /* WORK_COPY: out <- a; WORK_OP: out <- a op b; WORK_DIVIDE: out <- a / divisor */
    Py_ssize_t n;       /* WORK_COPY, WORK_EXPECT: bytes; else elements */
    long divisor;
    const char *expected; /* WORK_EXPECT: the bytes recorded at out (borrowed: the works tuple owns them) */
} Work;

/* A message posted anew by every run at its root's base + offset: its request is requests[index]. */
typedef struct {
    int index, receive, bytes, peer, tag;
    Ref buf;
} Message;

typedef struct {
    int count;                 /* requests: the persistent ones first, then `nfresh` made by every run */
    int nfresh;
    Message *fresh;
    char *requests;            /* count handles, contiguous */
    char *statuses;            /* count statuses, contiguous */
    PyObject *request_objects; /* the step's list of MPI.Request: the handles while Python holds them */
    uintptr_t *status_objects; /* per request, where its MPI.Status object keeps its status (0: none) */
    int checks;                /* receives to check */
    int *check_index, *check_bytes;
    PyObject *works;           /* the work as Python gave it (it keeps callables and arrays alive) */
    Py_ssize_t nwork;
    Work *work;                /* run once the exchange is complete */
    PyObject *during_works;
    Py_ssize_t nduring;
    Work *during;              /* run once its messages are started, before waiting for them */
} Exchange;

/* ---- a communicator's hot state, shared by Python and the C paths ----
 *
 * What every call reads or counts lives here, in C structs whose fields Python reads and writes
 * as members (Ring and Engine hold one HotState; mpiring.engine.state is the same in Python where
 * this file was not built). The Shortcut and the persistent request take the object when they
 * are made and read its fields directly: no attribute is looked up by name on a call's path, so
 * renaming Python code cannot slow or break them. */

/* Traffic's fields (mpiring.engine.transport.Traffic subclasses this): what a communicator has
   handed to MPI, or what one run of a program hands it. */
typedef struct {
    PyObject_HEAD
    long long bytes_sent, bytes_received, messages;
} Counters;

static PyTypeObject CountersType;

static int counters_init(Counters *self, PyObject *args, PyObject *kwds) {
    static char *names[] = {"bytes_sent", "bytes_received", "messages", NULL};
    self->bytes_sent = self->bytes_received = self->messages = 0;
    return PyArg_ParseTupleAndKeywords(args, kwds, "|LLL", names, &self->bytes_sent, &self->bytes_received,
                                       &self->messages) ? 0 : -1;
}

static PyObject *counters_richcompare(PyObject *a, PyObject *b, int op) {
    if ((op != Py_EQ && op != Py_NE) || !PyObject_TypeCheck(b, &CountersType) || Py_TYPE(a) != Py_TYPE(b))
        Py_RETURN_NOTIMPLEMENTED;
    const Counters *x = (const Counters *)a, *y = (const Counters *)b;
    int equal = x->bytes_sent == y->bytes_sent && x->bytes_received == y->bytes_received &&
                x->messages == y->messages;
    return PyBool_FromLong(op == Py_EQ ? equal : !equal);
}

static PyObject *counters_repr(Counters *self) {
    return PyUnicode_FromFormat("%s(bytes_sent=%lld, bytes_received=%lld, messages=%lld)", _PyType_Name(Py_TYPE(self)),
                                self->bytes_sent, self->bytes_received, self->messages);
}

/* total += once, field by field */
static void add_counters(Counters *total, const Counters *once) {
    total->bytes_sent += once->bytes_sent;
    total->bytes_received += once->bytes_received;
    total->messages += once->messages;
}

/* add(once): these += once's, field by field (a call's count in one step: Python's field by field
   reads would box and unbox each). */
static PyObject *counters_add(Counters *self, PyObject *once) {
    if (!PyObject_TypeCheck(once, &CountersType)) {
        PyErr_SetString(PyExc_TypeError, "add(once): once is a Traffic");
        return NULL;
    }
    add_counters(self, (const Counters *)once);
    Py_RETURN_NONE;
}

static PyMethodDef counters_methods[] = {
    {"add", (PyCFunction)counters_add, METH_O, "add(once): add once's counts to these"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef counters_members[] = { /* (their docs are Traffic's, in docs/api-reference.md) */
    {"bytes_sent", T_LONGLONG, offsetof(Counters, bytes_sent), 0, NULL},
    {"bytes_received", T_LONGLONG, offsetof(Counters, bytes_received), 0, NULL},
    {"messages", T_LONGLONG, offsetof(Counters, messages), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject CountersType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpiring.engine._replay.Counters",
    .tp_basicsize = sizeof(Counters),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Counters(bytes_sent=0, bytes_received=0, messages=0): Traffic's fields in C",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)counters_init,
    .tp_repr = (reprfunc)counters_repr,
    .tp_richcompare = counters_richcompare,
    .tp_hash = PyObject_HashNotImplemented, /* mutable, compared by value: unhashable, as a dataclass */
    .tp_members = counters_members,
    .tp_methods = counters_methods,
};

/* Every field is a Python object at a fixed offset: Python reads and writes them as members as
   fast as __slots__ (T_OBJECT_EX, which its interpreter specializes; a C number would be boxed
   anew at each read), and C reads them here directly, checking their types as it reads (a field
   Python set to anything unexpected is a miss, never a crash). */
typedef struct {
    PyObject_HEAD
    PyObject *calls;     /* int: collective calls made so far, each took a sequence number */
    PyObject *served;    /* int (threading.get_ident) or None: the thread the fast paths serve */
    PyObject *owner;     /* int or None: the thread that made the first call */
    PyObject *timeout;   /* float or None: the default timeout in seconds (None: no limit) */
    PyObject *freed;     /* bool: the communicator was freed */
    PyObject *broken;    /* str or None: why the ring broke */
    PyObject *in_flight; /* list: nonblocking calls and persistent runs not yet done (never replaced) */
    PyObject *programs;  /* dict: layout key -> Program, the cache's compiled schedules (never replaced) */
    Counters *traffic;   /* what the communicator has handed to MPI (never replaced) */
} HotState;

enum { HOT_FIELDS = 9 }; /* all held */

static PyTypeObject HotStateType;

static PyObject *hot_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    HotState *self = (HotState *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->calls = PyLong_FromLong(0);
    self->served = Py_NewRef(Py_None);
    self->owner = Py_NewRef(Py_None);
    self->timeout = Py_NewRef(Py_None);
    self->freed = Py_NewRef(Py_False);
    self->broken = Py_NewRef(Py_None);
    self->in_flight = PyList_New(0);
    self->programs = PyDict_New();
    if (self->calls == NULL || self->in_flight == NULL || self->programs == NULL)
        Py_CLEAR(self);
    return (PyObject *)self;
}

/* HotState(traffic): the communicator's Traffic, counted into for its life. */
static int hot_init(HotState *self, PyObject *args, PyObject *kwds) {
    Counters *traffic;
    static char *names[] = {"traffic", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!", names, &CountersType, &traffic))
        return -1;
    Py_XSETREF(self->traffic, (Counters *)Py_NewRef((PyObject *)traffic));
    return 0;
}

static int hot_traverse(HotState *self, visitproc visit, void *arg) {
    PyObject *held[HOT_FIELDS] = {self->calls, self->served, self->owner, self->timeout, self->freed,
                                  self->broken, self->in_flight, self->programs, (PyObject *)self->traffic};
    for (int i = 0; i < HOT_FIELDS; i++)
        Py_VISIT(held[i]);
    return 0;
}

static int hot_clear(HotState *self) {
    PyObject **held[HOT_FIELDS] = {&self->calls, &self->served, &self->owner, &self->timeout, &self->freed,
                                   &self->broken, &self->in_flight, &self->programs, (PyObject **)&self->traffic};
    for (int i = 0; i < HOT_FIELDS; i++)
        Py_CLEAR(*held[i]);
    return 0;
}

static void hot_dealloc(HotState *self) {
    PyObject_GC_UnTrack(self);
    hot_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef hot_members[] = {
    {"calls", T_OBJECT_EX, offsetof(HotState, calls), 0, "collective calls made so far (an int)"},
    {"served", T_OBJECT_EX, offsetof(HotState, served), 0, "the thread the fast paths serve (None: none)"},
    {"owner", T_OBJECT_EX, offsetof(HotState, owner), 0, "the thread that made the first call (None: none yet)"},
    {"timeout", T_OBJECT_EX, offsetof(HotState, timeout), 0, "the default timeout in seconds (None: no limit)"},
    {"freed", T_OBJECT_EX, offsetof(HotState, freed), 0, "whether the communicator was freed"},
    {"broken", T_OBJECT_EX, offsetof(HotState, broken), 0, "why the ring broke, or None"},
    {"in_flight", T_OBJECT_EX, offsetof(HotState, in_flight), READONLY, "the collectives in flight (a list)"},
    {"programs", T_OBJECT_EX, offsetof(HotState, programs), READONLY, "layout key -> Program (Cache.compiled)"},
    {"traffic", T_OBJECT_EX, offsetof(HotState, traffic), READONLY, "the communicator's Traffic"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject HotStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpiring.engine._replay.HotState",
    .tp_basicsize = sizeof(HotState),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "HotState(traffic): a communicator's state that every call reads or counts, as C fields",
    .tp_new = hot_new,
    .tp_init = (initproc)hot_init,
    .tp_dealloc = (destructor)hot_dealloc,
    .tp_traverse = (traverseproc)hot_traverse,
    .tp_clear = (inquiry)hot_clear,
    .tp_members = hot_members,
};

/* 1: the calling thread is the one the state serves (HotState.served: the owner, while the
   communicator is usable); else 0. Every C way into a call checks this first, under the GIL,
   before it changes anything: a second thread goes to Python, which refuses it
   (ConcurrentUseError) without touching what a run of the owner's may be using while its waits
   let go of the GIL. */
static int owned(const HotState *state) {
    PyObject *served = state->served;
    return served != NULL && PyLong_CheckExact(served) && PyLong_AsUnsignedLong(served) == PyThread_get_thread_ident();
}

/* The call count now, if it is a plain int (else -1, a miss: Python counts that call). */
static long long calls_now(const HotState *state) {
    PyObject *calls = state->calls;
    long long now = calls != NULL && PyLong_CheckExact(calls) ? PyLong_AsLongLong(calls) : -1;
    if (now < 0)
        PyErr_Clear();
    return now;
}

/* state.calls = `now` (a new reference to it, or NULL with an error) */
static PyObject *count_to(HotState *state, long long now) {
    PyObject *number = PyLong_FromLongLong(now);
    if (number != NULL)
        Py_XSETREF(state->calls, Py_NewRef(number));
    return number;
}

/* 1: the state's objects are there; 0 before its __init__ ran, or once a garbage collection
   cleared it (a cycle's objects are cleared in any order: what holds it may still be called from
   a finalizer). The C paths then go to Python, which raises rather than crashes. */
static int hot_live(const HotState *state) {
    return state->in_flight != NULL && state->programs != NULL && state->traffic != NULL;
}

/* hot_live, else 0 with an error (a Shortcut or persistent request being made on it). */
static int hot_ready(const HotState *state) {
    if (!hot_live(state))
        PyErr_SetString(PyExc_TypeError, "a HotState used before it was made (__init__)");
    return hot_live(state);
}

typedef struct {
    PyObject_HEAD
    intptr_t comm;             /* the communicator's handle: the messages go there */
    intptr_t notice_comm;      /* where peers' notices come (their own communicator: a probe there never
                                  walks the queue of messages a root sent ahead) */
    char busy;                 /* spin without offering the core (the node has a core per rank) */
    int tag;                   /* the call's tag: a message's tag is this plus its own */
    int sequence_base, sequence_shift, sequence_mask; /* where the call's number goes in its tag (mask 0: none) */
    int notice;                /* the tag of a notice that a peer left a call of this generation (-1: none) */
    Py_ssize_t nroots;
    char **base;               /* roots: 0 and 1 bound per call (x, out), the rest the schedule's own */
    PyObject *owned;           /* the owned roots' arrays, kept alive */
    PyObject *x, *out;         /* the arrays bound now, for work done in Python (None between calls) */
    Py_ssize_t x_bytes, out_bytes; /* what a bound x and out must hold */
    Py_ssize_t x_items, out_items; /* their elements (-1: unknown, their size is asked of the buffer protocol) */
    PyObject *allocate;        /* makes the result when the call gives no out= (None: out is given) */
    int result;                /* what a call returns: RESULT_NONE, RESULT_OUT, RESULT_X */
    Counters *traffic;         /* what one run hands MPI (a Traffic), for the call's counting */
    PyObject *schedule;        /* the Python object this is the C form of */
    long long used;            /* the call count when it last ran (the cache evicts the least recent) */
    char cached;               /* in its communicator's table of compiled schedules (Cache sets it) */
    long long runs;            /* blocking calls that ran it */
    PyObject *prologue;
    Py_ssize_t nprologue;
    Work *prologue_work;       /* run before a run's first exchange */
    Py_ssize_t length;
    Exchange *exchanges;
} Program;

enum { RESULT_NONE = 0, RESULT_OUT = 1, RESULT_X = 2 };

static int get_count(const void *status, int *count) {
    if (mpi.datatype_size == (Py_ssize_t)sizeof(int))
        return ((get_count_int_fn)mpi.get_count)(status, (int)mpi.byte_type, count);
    return ((get_count_pointer_fn)mpi.get_count)(status, (void *)mpi.byte_type, count);
}

/* A peer's notice that it left a call of this generation is waiting (a call that completed may
   have taken data that peer sent for the call it left): 1, else 0 (or an MPI error: 0, the run
   stands as a Python run would). */
static int notice_waiting(const Program *p) {
    int flag = 0;
    char status[256];
    if (p->notice < 0 || mpi.status_size > (Py_ssize_t)sizeof(status))
        return 0;
    if (mpi.datatype_size == (Py_ssize_t)sizeof(int))
        ((iprobe_int_fn)mpi.iprobe)(mpi.any_source, p->notice, (int)p->notice_comm, &flag, status);
    else
        ((iprobe_pointer_fn)mpi.iprobe)(mpi.any_source, p->notice, (void *)p->notice_comm, &flag, status);
    return flag;
}

/* `tag` for the call numbered `calls` (blocking tags carry it, mpiring.engine.tags.with_sequence). */
static int numbered(const Program *p, int tag, long long calls) {
    int field = p->sequence_mask << p->sequence_shift, offset = tag - p->sequence_base;
    return p->sequence_base + ((offset & ~field) | (int)(calls & p->sequence_mask) << p->sequence_shift);
}

/* The program's tag (a blocking one: a persistent request's carries no number), and the notice
   it looks for, for the call numbered `calls`. */
static void number_call(Program *p, long long calls) {
    if (!p->sequence_mask)
        return;
    if (p->tag >= p->sequence_base)
        p->tag = numbered(p, p->tag, calls);
    if (p->notice >= 0)
        p->notice = numbered(p, p->notice, calls);
}

static char *address(const Program *p, Ref ref) {
    return ref.root < 0 ? (char *)ref.offset : p->base[ref.root] + ref.offset;
}

static int post(const Program *p, const Message *m, void *request) {
    void *function = m->receive ? mpi.irecv : mpi.isend;
    char *buf = address(p, m->buf);
    int tag = p->tag + m->tag;
    if (mpi.datatype_size == (Py_ssize_t)sizeof(int))
        return ((message_int_fn)function)(buf, m->bytes, (int)mpi.byte_type, m->peer, tag, (int)p->comm, request);
    return ((message_pointer_fn)function)(buf, m->bytes, (void *)mpi.byte_type, m->peer, tag, (void *)p->comm,
                                          request);
}

/* Start an exchange: its persistent requests, then its messages made anew (receives first, as recorded). */
static int start_exchange(const Program *p, Exchange *e) {
    int code = 0;
    if (e->count > e->nfresh)
        code = mpi.startall(e->count - e->nfresh, e->requests);
    for (int i = 0; i < e->nfresh && !code; i++)
        code = post(p, &e->fresh[i], e->requests + e->fresh[i].index * mpi.request_size);
    return code;
}

/* The fresh messages' handles to (`out`) or from the step's MPI.Request objects. */
static void mirror(Exchange *e, int out) {
    for (int i = 0; i < e->nfresh; i++) {
        int index = e->fresh[i].index;
        char *here = e->requests + index * mpi.request_size;
        char *there = (char *)PyList_GET_ITEM(e->request_objects, index) + mpi.request_offset;
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

/* ---- arithmetic: out[i] = a[i] op b[i], exactly as NumPy's ufuncs ---- */

#define LOOP(T, EXPR)                                                       \
    do {                                                                    \
        T *o = (T *)out;                                                    \
        const T *x = (const T *)a, *y = (const T *)b;                       \
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

/* 0: done; -1: a callable raised; 1: a layout differs from the one recorded (WORK_EXPECT). */
static int do_work(const Program *p, const Work *work, Py_ssize_t n) {
    for (Py_ssize_t w = 0; w < n; w++) {
        const Work *k = &work[w];
        if (k->kind == WORK_EXPECT) {
            if (memcmp(address(p, k->out), k->expected, (size_t)k->n) != 0)
                return 1;
        } else if (k->kind == WORK_COPY) {
            memmove(address(p, k->out), address(p, k->a), (size_t)k->n);
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

/* ---- building a Program from plain data ---- */

static int parse_ref(PyObject *item, Ref *ref) {
    return PyArg_ParseTuple(item, "in", &ref->root, &ref->offset) ? 0 : -1;
}

static int check_ref(const Ref *ref, Py_ssize_t nroots) {
    if (ref->root >= nroots || ref->root < -1) {
        PyErr_SetString(PyExc_ValueError, "a reference names no root of its program");
        return -1;
    }
    return 0;
}

/* Work from a tuple whose items are callables or (kind, op, dtype, out, a, b, n, divisor), each
   operand a (root, offset) pair. */
static Work *work_init(PyObject *works, Py_ssize_t *n, Py_ssize_t nroots) {
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

static void program_clear(Program *self) {
    Py_CLEAR(self->prologue);
    PyMem_Free(self->prologue_work);
    self->prologue_work = NULL;
    self->nprologue = 0;
    if (self->exchanges != NULL) {
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
            Py_XDECREF(e->request_objects);
        }
        PyMem_Free(self->exchanges);
        self->exchanges = NULL;
    }
    self->length = 0;
    PyMem_Free(self->base);
    self->base = NULL;
    self->nroots = 0;
    Py_CLEAR(self->owned);
    Py_CLEAR(self->x);
    Py_CLEAR(self->out);
    Py_CLEAR(self->allocate);
    Py_CLEAR(self->traffic);
    Py_CLEAR(self->schedule);
}

static int program_traverse(Program *self, visitproc visit, void *arg) {
    Py_VISIT(self->prologue);
    Py_VISIT(self->owned);
    Py_VISIT(self->x);
    Py_VISIT(self->out);
    Py_VISIT(self->allocate);
    Py_VISIT(self->traffic);
    Py_VISIT(self->schedule);
    for (Py_ssize_t i = 0; self->exchanges != NULL && i < self->length; i++) {
        Py_VISIT(self->exchanges[i].works);
        Py_VISIT(self->exchanges[i].during_works);
        Py_VISIT(self->exchanges[i].request_objects);
    }
    return 0;
}

static int program_tp_clear(Program *self) {
    program_clear(self);
    return 0;
}

static void program_dealloc(Program *self) {
    PyObject_GC_UnTrack(self);
    program_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* One exchange from (handles: bytes (its persistent requests), request_objects: the step's list of
   MPI.Request, status_objects: tuple of int or None, checks: tuple of (index, bytes), works,
   fresh: tuple of (index, receive, (root, offset), bytes, peer, tag), during: work as `works`,
   done while its messages are in flight). */
static int exchange_init(Exchange *e, PyObject *spec, Py_ssize_t nroots) {
    PyObject *handles, *request_objects, *status_objects, *checks, *works, *fresh, *during;
    if (!PyArg_ParseTuple(spec, "O!O!O!O!O!O!O!", &PyBytes_Type, &handles, &PyList_Type, &request_objects,
                          &PyTuple_Type, &status_objects, &PyTuple_Type, &checks, &PyTuple_Type, &works, &PyTuple_Type,
                          &fresh, &PyTuple_Type, &during))
        return -1;
    Py_ssize_t persistent = PyBytes_GET_SIZE(handles);
    e->nfresh = (int)PyTuple_GET_SIZE(fresh);
    if (persistent % mpi.request_size != 0) {
        PyErr_SetString(PyExc_ValueError, "handles of a partial request");
        return -1;
    }
    e->count = (int)(persistent / mpi.request_size) + e->nfresh;
    if (PyTuple_GET_SIZE(status_objects) != e->count || PyList_GET_SIZE(request_objects) != e->count) {
        PyErr_SetString(PyExc_ValueError, "requests, request objects and status objects disagree");
        return -1;
    }
    e->checks = (int)PyTuple_GET_SIZE(checks);
    e->requests = PyMem_Calloc(e->count ? e->count : 1, mpi.request_size);
    e->statuses = PyMem_Calloc(e->count ? e->count : 1, mpi.status_size);
    e->status_objects = PyMem_Calloc(e->count ? e->count : 1, sizeof(uintptr_t));
    e->check_index = PyMem_Calloc(e->checks ? e->checks : 1, sizeof(int));
    e->check_bytes = PyMem_Calloc(e->checks ? e->checks : 1, sizeof(int));
    e->fresh = PyMem_Calloc(e->nfresh ? e->nfresh : 1, sizeof(Message));
    if (!e->requests || !e->statuses || !e->status_objects || !e->check_index || !e->check_bytes || !e->fresh) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(e->requests, PyBytes_AS_STRING(handles), persistent);
    Py_INCREF(request_objects);
    e->request_objects = request_objects;
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
    for (int i = 0; i < e->nfresh; i++) {
        Message *m = &e->fresh[i];
        PyObject *buf;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fresh, i), "ipOiii", &m->index, &m->receive, &buf, &m->bytes, &m->peer,
                              &m->tag) ||
            parse_ref(buf, &m->buf) < 0 || check_ref(&m->buf, nroots) < 0)
            return -1;
        if (m->index != e->count - e->nfresh + i || m->bytes < 0) {
            PyErr_SetString(PyExc_ValueError, "fresh messages must be the exchange's last requests, in order");
            return -1;
        }
    }
    if (PyErr_Occurred())
        return -1;
    Py_INCREF(works);
    e->works = works;
    e->work = work_init(works, &e->nwork, nroots);
    if (e->work == NULL)
        return -1;
    Py_INCREF(during);
    e->during_works = during;
    e->during = work_init(during, &e->nduring, nroots);
    return e->during == NULL ? -1 : 0;
}

/* Program(prologue, exchanges, comm, busy, tag, roots, owned, x_bytes, out_bytes, allocate, result,
   traffic, schedule, sequence=(base, shift, mask), notice=-1, items=(-1, -1), notice_comm=comm): roots:
   a tuple of root addresses (0 and 1 placeholders, bound per call). */
static int program_init(Program *self, PyObject *args, PyObject *kwds) {
    PyObject *prologue, *specs, *roots, *owned, *allocate, *traffic, *schedule;
    unsigned long long comm, notice_comm = 0;
    int busy = 0, tag = 0, result = RESULT_NONE, base = 0, shift = 0, mask = 0, notice = -1;
    Py_ssize_t x_bytes = 0, out_bytes = 0, x_items = -1, out_items = -1;
    static char *names[] = {"prologue", "exchanges", "comm", "busy", "tag", "roots", "owned", "x_bytes",
                            "out_bytes", "allocate", "result", "traffic", "schedule", "sequence", "notice",
                            "items", "notice_comm", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!KpiO!OnnOiO!O|(iii)i(nn)K", names, &PyTuple_Type, &prologue,
                                     &PyTuple_Type, &specs, &comm, &busy, &tag, &PyTuple_Type, &roots, &owned, &x_bytes,
                                     &out_bytes, &allocate, &result, &CountersType, &traffic, &schedule, &base, &shift, &mask,
                                     &notice, &x_items, &out_items, &notice_comm))
        return -1;
    if (!mpi.bound) {
        PyErr_SetString(PyExc_RuntimeError, "bind() the MPI library first");
        return -1;
    }
    program_clear(self);
    self->comm = (intptr_t)comm;
    self->notice_comm = (intptr_t)(notice_comm ? notice_comm : comm);
    self->busy = (char)busy;
    self->tag = tag;
    self->sequence_base = base;
    self->sequence_shift = shift;
    self->sequence_mask = mask;
    self->notice = notice;
    self->result = result;
    self->x_bytes = x_bytes;
    self->out_bytes = out_bytes;
    self->x_items = x_items;
    self->out_items = out_items;
    self->nroots = PyTuple_GET_SIZE(roots);
    self->base = PyMem_Calloc(self->nroots ? self->nroots : 1, sizeof(char *));
    if (self->base == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t r = 0; r < self->nroots; r++)
        self->base[r] = (char *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(roots, r));
    if (PyErr_Occurred())
        return -1;
    self->owned = Py_NewRef(owned);
    self->x = Py_NewRef(Py_None);
    self->out = Py_NewRef(Py_None);
    self->allocate = Py_NewRef(allocate);
    self->traffic = (Counters *)Py_NewRef(traffic);
    self->schedule = Py_NewRef(schedule);
    Py_INCREF(prologue);
    self->prologue = prologue;
    self->prologue_work = work_init(prologue, &self->nprologue, self->nroots);
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
        if (exchange_init(&self->exchanges[i], PyTuple_GET_ITEM(specs, i), self->nroots) < 0)
            return -1;
    return 0;
}

/* ---- running ---- */

/* Hand exchange `index` back to Python; on a size or MPI error, its statuses go where Python reads them. */
static PyObject *stopped(const Exchange *e, Py_ssize_t index, int reason, int code) {
    if (reason != STOPPED_WAITING)
        for (int i = 0; i < e->count; i++)
            if (e->status_objects[i])
                memcpy((void *)e->status_objects[i], e->statuses + i * mpi.status_size, mpi.status_size);
    return Py_BuildValue("(nii)", index, reason, code);
}

/* run(first, started, spin): run exchanges first.. to the end (`started`: the first one's requests
   already are; a run from the very beginning, first 0 and not started, does the prologue first).
   spin < 0: wait without a timeout (MPI_Waitall); else test for at most `spin` seconds, offering
   the core between tests unless `busy`, as waiting.poll does. Returns None when every exchange is
   done, else (exchange, reason, code): see the head of this file. */
static PyObject *run_from(Program *self, Py_ssize_t first, int started, double spin) {
    if (self->exchanges == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this program was released");
        return NULL;
    }
    if (first == 0 && !started && do_work(self, self->prologue_work, self->nprologue) < 0)
        return NULL; /* (a prologue holds no WORK_EXPECT: layouts are checked after their exchange) */
    for (Py_ssize_t index = first; index < self->length; index++) {
        Exchange *e = &self->exchanges[index];
        int code = 0, done = 0;
        if (index > first || !started) {
            code = start_exchange(self, e);
            if (code) {
                mirror(e, 1);
                return stopped(e, index, STOPPED_ERROR, code);
            }
            if (do_work(self, e->during, e->nduring) < 0) { /* host copies (schedule.fuse): they do not fail */
                mirror(e, 1);
                return NULL;
            }
        } else {
            mirror(e, 0); /* Python started it, and may have seen some of its messages complete */
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
        int worked = do_work(self, e->work, e->nwork);
        if (worked < 0)
            return NULL;
        if (worked > 0)
            return stopped(e, index, STOPPED_CHANGED, 0);
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

/* bind(x, out, x_address, out_address): the arrays a run works on, as Python checked them (the
   Shortcut binds in C); unbind(): let them go. */
static char *memory_of(PyObject *array, Py_ssize_t bytes, Py_ssize_t items, int writable);

/* Where root 0 (x) or 1 (out) is: the address given, else (None) the array's own memory. */
static char *address_of(Program *self, PyObject *array, PyObject *address, int root) {
    if (address != Py_None)
        return (char *)PyLong_AsVoidPtr(address);
    if (array == Py_None)
        return NULL;
    return root ? memory_of(array, self->out_bytes, self->out_items, 1) : memory_of(array, self->x_bytes,
                                                                                   self->x_items, 0);
}

static PyObject *program_bind(Program *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || self->nroots < 2) {
        PyErr_SetString(PyExc_TypeError, "bind(x, out, x_address, out_address) on a program with roots");
        return NULL;
    }
    char *x = address_of(self, args[0], args[2], 0), *out = address_of(self, args[1], args[3], 1);
    if (PyErr_Occurred())
        return NULL;
    Py_XSETREF(self->x, Py_NewRef(args[0]));
    Py_XSETREF(self->out, Py_NewRef(args[1]));
    self->base[0] = x;
    self->base[1] = out;
    Py_RETURN_NONE;
}

static void unbind(Program *self) {
    Py_XSETREF(self->x, Py_NewRef(Py_None));
    Py_XSETREF(self->out, Py_NewRef(Py_None));
}

static PyObject *program_unbind(Program *self, PyObject *unused) {
    unbind(self);
    Py_RETURN_NONE;
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
    int code = start_exchange(self, e);
    mirror(e, 1);
    return PyLong_FromLong(code);
}

/* begin(): a run from the very beginning that Python will wait for (a persistent request's
   start): the prologue, then exchange 0 started and its work in flight done; the MPI error code,
   -1 if work raised. */
static int begin(Program *self) {
    if (do_work(self, self->prologue_work, self->nprologue) < 0)
        return -1;
    if (self->length == 0)
        return 0;
    Exchange *e = &self->exchanges[0];
    int code = start_exchange(self, e);
    mirror(e, 1);
    if (!code && do_work(self, e->during, e->nduring) < 0)
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

/* supports(op, dtype): whether WORK_OP with these codes is done here (native.py asks). */
static PyObject *supports(PyObject *module, PyObject *args) {
    int op, dtype;
    if (!PyArg_ParseTuple(args, "ii", &op, &dtype))
        return NULL;
    return PyBool_FromLong(op_supported(op, dtype));
}

static PyMethodDef program_methods[] = {
    {"run", (PyCFunction)(void (*)(void))program_run, METH_FASTCALL,
     "run(first, started, spin): None when done, else (exchange, reason, MPI error code)"},
    {"bind", (PyCFunction)(void (*)(void))program_bind, METH_FASTCALL,
     "bind(x, out, x_address, out_address): the arrays roots 0 and 1 are for the next run (an address None: "
     "the array's own)"},
    {"unbind", (PyCFunction)program_unbind, METH_NOARGS, "let the bound arrays go"},
    {"start", (PyCFunction)program_start, METH_O, "start(index): start one exchange; the MPI error code"},
    {"begin", (PyCFunction)program_begin, METH_NOARGS,
     "begin(): the prologue, then exchange 0 started (and its work in flight done); the MPI error code"},
    {"release", (PyCFunction)program_release, METH_NOARGS, "forget the handles and the buffers"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef program_members[] = {
    {"busy", T_BOOL, offsetof(Program, busy), READONLY, "whether a spin tests without offering the core"},
    {"cached", T_BOOL, offsetof(Program, cached), 0, "in its communicator's table (the Shortcut's memo asks)"},
    {"tag", T_INT, offsetof(Program, tag), 0, "the call's tag (a message's tag is this plus its own)"},
    {"notice", T_INT, offsetof(Program, notice), READONLY, "the notice tag it looks for after a call (-1: none)"},
    {"used", T_LONGLONG, offsetof(Program, used), 0, "the call count when it last ran"},
    {"runs", T_LONGLONG, offsetof(Program, runs), 0, "blocking calls that ran it"},
    {"x", T_OBJECT, offsetof(Program, x), READONLY, "the x bound now (None between calls)"},
    {"out", T_OBJECT, offsetof(Program, out), READONLY, "the out bound now (None between calls)"},
    {"schedule", T_OBJECT, offsetof(Program, schedule), READONLY, "the schedule this is the C form of"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpiring.engine._replay.Program",
    .tp_basicsize = sizeof(Program),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A schedule or plan replayed in C (native.program makes it from plain data)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)program_init,
    .tp_dealloc = (destructor)program_dealloc,
    .tp_traverse = (traverseproc)program_traverse,
    .tp_clear = (inquiry)program_tp_clear,
    .tp_methods = program_methods,
    .tp_members = program_members,
};

/* ---- shared helpers of the shortcuts ---- */

static PyObject *s_shape, *s_dtype, *s_view, *zero;

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

/* The program's result after a run: its out, its x, or None (a new reference). */
static PyObject *result_of(Program *p) {
    if (p->result == RESULT_OUT)
        return Py_NewRef(p->out);
    if (p->result == RESULT_X)
        return Py_NewRef(p->x);
    Py_RETURN_NONE;
}

/*
 * A blocking host call whose schedule is cached, taken without running Python (engine/engine.py).
 *
 *   comm.allreduce(x, out=y) ─► Shortcut(collective, x, out, op, root, counts, algorithm, timeout)
 *       the key: (collective, op, root, counts, algorithm, x.dtype, x.shape, out.dtype, out.shape,
 *       x is out), as mpiring.engine.schedule.layout_key makes it; a compiled schedule under it;
 *       x and out (where given) NumPy arrays, C-contiguous (out writable), of the schedule's sizes,
 *       the same array or apart; the thread the state serves (its owner, while not broken or freed),
 *       nothing in flight, no per-call timeout (and no MPIRING_CHECK: not made then)
 *           yes ─► bind them (a new result when out= is not given) ─► the call count and
 *                  traffic ─► run ─► the result
 *                      └── stopped or raised ─► after(program, stopped, spin, error): Python carries on
 *           no  ─► in_python(the same arguments): the whole call, as if this were not here
 *
 * It changes nothing before it has decided: any doubt (an error while looking) is a miss, and
 * Python decides again. A second thread is a miss too, and Python refuses it without touching
 * what a run of the owner's may be using while its waits let go of the GIL. Binding reads each
 * array's memory through the buffer protocol, so an array restrided, resized or made read-only
 * since the last call is seen for what it is now.
 */
enum { KEY_ITEMS = 10, MEMO_ARGS = 5, FACT_DIMS = 8 };

/* An array as a key sees it (ArrayHead): its memory, flags, shape and dtype (held); nd -1: None. */
typedef struct {
    char *data;
    int nd, flags;
    Py_ssize_t dims[FACT_DIMS];
    PyObject *descr;
} Facts;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    HotState *state;        /* the communicator's: its programs, thread, calls, traffic, timeout */
    PyTypeObject *ndarray;  /* numpy.ndarray: only its exact instances are bound here */
    PyObject *in_python;    /* the call in Python */
    PyObject *after;        /* where Python takes over a run that stopped or raised */
    double yield_seconds;   /* the longest spin before Python's waiting.poll takes over */
    /* the last hit, found again without building its key: its arguments but x and out (held),
       whether x was out, what x and out looked like (ArrayHead), and its program (held) */
    PyObject *memo_args[MEMO_ARGS];
    int memo_in_place;
    Facts memo_arrays[2];
    Program *memo;
} Shortcut;

/* dtype and shape of `array` (new references), None for None; 0 on success, -1 if not an exact ndarray. */
static int describe(Shortcut *self, PyObject *array, PyObject **dtype, PyObject **shape) {
    if (array == Py_None) {
        *dtype = Py_NewRef(Py_None);
        *shape = Py_NewRef(Py_None);
        return 0;
    }
    if (Py_TYPE(array) != self->ndarray)
        return -1;
    *dtype = PyObject_GetAttr(array, s_dtype);
    *shape = *dtype ? PyObject_GetAttr(array, s_shape) : NULL;
    if (*shape == NULL) {
        Py_CLEAR(*dtype);
        return -1;
    }
    return 0;
}

/* The thread the state serves calls (`owned`), its call count a plain int, and how long a wait
   of its calls spins (from the default timeout): 1, else 0 (a miss). */
static int spin_for(Shortcut *self, double *spin) {
    const HotState *state = self->state;
    PyObject *timeout = state->timeout;
    if (!owned(state) || calls_now(state) < 0 || timeout == NULL)
        return 0;
    if (timeout == Py_None) {
        *spin = -1.0;
        return 1;
    }
    double seconds = PyFloat_CheckExact(timeout) ? PyFloat_AS_DOUBLE(timeout)
                     : PyLong_CheckExact(timeout) ? PyLong_AsDouble(timeout) : -1.0;
    if (seconds < 0) /* not a number of seconds (Engine.timeout stores floats): Python decides */
        return 0;
    *spin = seconds < self->yield_seconds ? seconds : self->yield_seconds;
    return 1;
}

/* The compiled schedule of this call (borrowed: the table holds it) and its spin; NULL: a miss. */
static Program *hit(Shortcut *self, PyObject *const *args, double *spin) {
    PyObject *x = args[1], *out = args[2];
    if (args[7] != Py_None || PyList_GET_SIZE(self->state->in_flight)) /* Python checks a per-call timeout */
        return NULL;
    PyObject *items[KEY_ITEMS] = {args[0], args[3], args[4], args[5], args[6], NULL, NULL, NULL, NULL,
                                  x == out && x != Py_None ? Py_True : Py_False};
    if (describe(self, x, &items[5], &items[6]) < 0)
        return NULL;
    if (describe(self, out, &items[7], &items[8]) < 0) {
        Py_DECREF(items[5]);
        Py_DECREF(items[6]);
        return NULL;
    }
    PyObject *key = PyTuple_New(KEY_ITEMS);
    for (int i = 0; key != NULL && i < KEY_ITEMS; i++)
        PyTuple_SET_ITEM(key, i, i >= 5 && i < 9 ? items[i] : Py_NewRef(items[i]));
    if (key == NULL)
        for (int i = 5; i < 9; i++)
            Py_DECREF(items[i]);
    PyObject *found = key ? PyDict_GetItemWithError(self->state->programs, key) : NULL; /* unhashable: an error, a miss */
    Py_XDECREF(key);
    if (found == NULL || Py_TYPE(found) != &ProgramType || ((Program *)found)->exchanges == NULL)
        return NULL;
    return spin_for(self, spin) ? (Program *)found : NULL;
}

/* The leading fields of a NumPy array object as numpy/ndarraytypes.h lays them out
   (PyArrayObject_fields, the same from NumPy 1.7 to 2.x), read without NumPy's headers. They are
   used only once `read_arrays` has found them where they should be in live arrays (native.py
   asks when it binds the MPI library); until then, or if not, the buffer protocol serves. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions, *strides;
    PyObject *base, *descr;
    int flags;
} ArrayHead;
enum { ARRAY_C_CONTIGUOUS = 0x0001, ARRAY_WRITEABLE = 0x0400 };
static PyTypeObject *readable_arrays; /* numpy.ndarray, once its fields were found where expected */

/* read_arrays(samples): samples of (array, address, shape, strides, c_contiguous, writeable) as
   NumPy describes them; True (and the fields are read directly from now on) if every one agrees. */
static PyObject *read_arrays(PyObject *module, PyObject *samples) {
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
   `bytes` (`items` elements of the dtype the key `hit` found the schedule by: -1, unknown); NULL
   (an error set) if not. A NumPy array's fields are read directly. */
static char *memory_of(PyObject *array, Py_ssize_t bytes, Py_ssize_t items, int writable) {
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

/* ---- mpi4py's buffer specs, their common forms (mpiring.buffer_api.simple's first look) ---- */

static PyObject *spec_datatypes; /* {id(datatype): (datatype, dtype)}: the predefined datatypes a dtype moves as */
static PyObject *spec_dtypes;    /* the dtypes mpiring moves (a frozenset) */
static PyObject *spec_bytes;     /* {type: what makes an array of its bytes}: bytearray, mmap (numpy.frombuffer) */

/* spec_tables(datatypes, dtypes, byte_buffers): the tables spec_items reads (buffer_api's, once). */
static PyObject *spec_tables(PyObject *module, PyObject *args) {
    PyObject *datatypes, *dtypes, *byte_buffers;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyDict_Type, &datatypes, &PyFrozenSet_Type, &dtypes, &PyDict_Type,
                          &byte_buffers))
        return NULL;
    Py_XSETREF(spec_datatypes, Py_NewRef(datatypes));
    Py_XSETREF(spec_dtypes, Py_NewRef(dtypes));
    Py_XSETREF(spec_bytes, Py_NewRef(byte_buffers));
    Py_RETURN_NONE;
}

/* `buffer` as a NumPy array: itself, or the array of its bytes where it is a byte buffer the
   tables name (a new reference); NULL, no error set, where it is neither. */
static PyObject *as_array(PyObject *buffer) {
    if (Py_TYPE(buffer) == readable_arrays)
        return Py_NewRef(buffer);
    PyObject *make = PyDict_GetItemWithError(spec_bytes, (PyObject *)Py_TYPE(buffer)); /* borrowed */
    PyObject *array = make ? PyObject_CallOneArg(make, buffer) : NULL;
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
   one it must refuse). Never raises for a spec. */
static PyObject *spec_items(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyLong_CheckExact(args[1]))
        return PyErr_Format(PyExc_TypeError, "spec_items(spec, blocks)");
    PyObject *spec = args[0];
    Py_ssize_t blocks = PyLong_AsSsize_t(args[1]), length;
    if (blocks < 1 || spec_datatypes == NULL) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyList_CheckExact(spec) ? PyList_GET_SIZE(spec) : 0;
    if (n == 0) { /* a buffer alone: a flat array of a dtype mpiring moves, or a byte buffer's bytes */
        PyObject *array = as_array(spec);
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
    PyObject *array = as_array(PyList_GET_ITEM(spec, 0)), *dtype = PyTuple_GET_ITEM(named, 1), *items;
    if (array == NULL)
        Py_RETURN_NONE;
    if ((length = flat_length(array)) < 0) {
        Py_DECREF(array);
        Py_RETURN_NONE;
    }
    if (dtype == ((const ArrayHead *)array)->descr) {
        items = array;
    } else { /* the memory seen as the datatype's elements, as MPI sees it ([floats, MPI.BYTE]) */
        items = PySet_Contains(spec_dtypes, ((const ArrayHead *)array)->descr) == 1
                    ? PyObject_CallMethodOneArg(array, s_view, dtype)
                    : NULL;
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

/* `facts` of `array` (None, or a readable NumPy array of at most FACT_DIMS axes): 1, else 0. */
static int facts_of(PyObject *array, Facts *facts) {
    if (array == Py_None) {
        facts->nd = -1;
        Py_CLEAR(facts->descr);
        return 1;
    }
    const ArrayHead *a = (const ArrayHead *)array;
    if (Py_TYPE(array) != readable_arrays || a->nd > FACT_DIMS)
        return 0;
    facts->data = a->data;
    facts->nd = a->nd;
    facts->flags = a->flags;
    memcpy(facts->dims, a->dimensions, sizeof(Py_ssize_t) * a->nd);
    Py_XSETREF(facts->descr, Py_NewRef(a->descr));
    return 1;
}

static int same_facts(PyObject *array, const Facts *facts) {
    if (array == Py_None || facts->nd < 0)
        return array == Py_None && facts->nd < 0;
    const ArrayHead *a = (const ArrayHead *)array;
    return Py_TYPE(array) == readable_arrays && a->data == facts->data && a->nd == facts->nd &&
           a->flags == facts->flags && a->descr == facts->descr &&
           memcmp(a->dimensions, facts->dims, sizeof(Py_ssize_t) * a->nd) == 0;
}

/* Whether `counts` is a tuple of ints, of None or of tuples of ints (alltoallv's pair), whose
   equality is exact and runs no Python code. */
static int plain_counts(PyObject *counts) {
    if (!PyTuple_CheckExact(counts))
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(counts); i++) {
        PyObject *item = PyTuple_GET_ITEM(counts, i);
        if (PyLong_CheckExact(item) || item == Py_None)
            continue;
        if (!PyTuple_CheckExact(item))
            return 0;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(item); j++)
            if (!PyLong_CheckExact(PyTuple_GET_ITEM(item, j)))
                return 0;
    }
    return 1;
}

/* counts= as the memo's: the same object, or (a tuple made anew each call from the caller's
   list) plain counts of equal value. */
static int same_counts(PyObject *counts, PyObject *memo) {
    if (counts == memo)
        return 1;
    if (!plain_counts(counts) || !plain_counts(memo))
        return 0;
    int equal = PyObject_RichCompareBool(counts, memo, Py_EQ);
    if (equal < 0)
        PyErr_Clear();
    return equal == 1;
}

/* The memo's program if this call is the memo's again: the same arguments (collective, op,
   root, algorithm: the very objects; counts equal), x and out as they were (the same layout
   key, so the same schedule), the program still in the table; NULL otherwise. */
static Program *memo_hit(Shortcut *self, PyObject *const *args) {
    static const int at[MEMO_ARGS] = {0, 3, 4, 5, 6};
    Program *p = self->memo;
    if (p == NULL || !p->cached || p->exchanges == NULL || (args[1] == args[2] && args[1] != Py_None) !=
        self->memo_in_place)
        return NULL;
    for (int i = 0; i < MEMO_ARGS; i++)
        if (at[i] == 5 ? !same_counts(args[5], self->memo_args[i]) : args[at[i]] != self->memo_args[i])
            return NULL;
    return same_facts(args[1], &self->memo_arrays[0]) && same_facts(args[2], &self->memo_arrays[1]) ? p : NULL;
}

/* Remember this hit (nothing, where x or out cannot be described). */
static void memo_keep(Shortcut *self, PyObject *const *args, Program *p) {
    static const int at[MEMO_ARGS] = {0, 3, 4, 5, 6};
    if (!facts_of(args[1], &self->memo_arrays[0]) || !facts_of(args[2], &self->memo_arrays[1])) {
        Py_CLEAR(self->memo);
        return;
    }
    for (int i = 0; i < MEMO_ARGS; i++)
        Py_XSETREF(self->memo_args[i], Py_NewRef(args[at[i]]));
    self->memo_in_place = args[1] == args[2] && args[1] != Py_None;
    Py_XSETREF(self->memo, (Program *)Py_NewRef((PyObject *)p));
}

/* Bind x and out (or a new result) to the program; 0, or -1 (an error set) on a miss. */
static int bind_call(Program *p, PyObject *x, PyObject *out) {
    char *x_memory = NULL, *out_memory = NULL;
    PyObject *result = NULL;
    if (x != Py_None && (x_memory = memory_of(x, p->x_bytes, p->x_items, 0)) == NULL)
        return -1;
    if (out == Py_None && p->allocate != Py_None) {
        result = PyObject_CallNoArgs(p->allocate);
        if (result == NULL || (out_memory = memory_of(result, p->out_bytes, p->out_items, 1)) == NULL) {
            Py_XDECREF(result);
            return -1;
        }
    } else if (out != Py_None) {
        if ((out_memory = memory_of(out, p->out_bytes, p->out_items, 1)) == NULL)
            return -1;
        if (x != out && x_memory && p->x_bytes && p->out_bytes && x_memory < out_memory + p->out_bytes &&
            out_memory < x_memory + p->x_bytes) {
            PyErr_SetString(PyExc_ValueError, "x and out overlap without being the same array");
            return -1;
        }
        result = Py_NewRef(out);
    }
    Py_XSETREF(p->x, Py_NewRef(x));
    Py_XSETREF(p->out, result ? result : Py_NewRef(Py_None));
    p->base[0] = x_memory;
    p->base[1] = out_memory;
    return 0;
}

/* program.used = state.calls = state.calls + 1 (a plain int: spin_for checked), and
   state.traffic += program.traffic, as Python counts a call; -1 if out of memory. */
static int count_call(HotState *state, Program *p) {
    long long now = calls_now(state) + 1;
    PyObject *number = count_to(state, now);
    if (number == NULL)
        return -1;
    Py_DECREF(number);
    p->used = now;
    p->runs++;
    number_call(p, now);
    add_counters(state->traffic, p->traffic);
    return 0;
}

static PyObject *shortcut_call(Shortcut *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    double spin = -1.0;
    Program *program = NULL;
    PyObject *result = NULL;
    if (self->in_python == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Shortcut called before it was made (__init__)");
        return NULL;
    }
    if (PyVectorcall_NARGS(nargsf) == 8 && kwnames == NULL && hot_live(self->state)) {
        if (args[7] == Py_None && !PyList_GET_SIZE(self->state->in_flight) && (program = memo_hit(self, args)) != NULL &&
            !spin_for(self, &spin))
            program = NULL;
        else if (program == NULL && (program = hit(self, args, &spin)) != NULL && program->nroots >= 2)
            memo_keep(self, args, program);
        if (program != NULL && (program->nroots < 2 || bind_call(program, args[1], args[2]) < 0))
            program = NULL;
        PyErr_Clear();
    }
    if (program == NULL)
        return PyObject_Vectorcall(self->in_python, args, nargsf, kwnames);
    Py_INCREF(program); /* a work callable could drop it from the table */
    PyObject *stopped = count_call(self->state, program) == 0 ? run_from(program, 0, 0, spin) : NULL;
    if (stopped == Py_None && notice_waiting(program)) {  /* Python raises, naming the peer */
        Py_DECREF(stopped);
        stopped = Py_BuildValue("(nii)", program->length, STOPPED_NOTICE, 0);
    }
    if (stopped == Py_None) {
        result = result_of(program);
    } else {
        PyObject *error = stopped == NULL ? caught() : NULL; /* recorded work raised: Python raises it */
        PyObject *spin_object = PyFloat_FromDouble(spin);
        if (spin_object != NULL)
            result = PyObject_CallFunctionObjArgs(self->after, (PyObject *)program, stopped ? stopped : Py_None,
                                                  spin_object, error ? error : Py_None, NULL);
        Py_XDECREF(spin_object);
        Py_XDECREF(error);
    }
    Py_XDECREF(stopped);
    unbind(program);
    Py_DECREF(program);
    return result;
}

static int shortcut_init(Shortcut *self, PyObject *args, PyObject *kwds) {
    PyObject *state, *ndarray, *in_python, *after;
    double yield_seconds;
    static char *names[] = {"state", "ndarray", "in_python", "after", "yield_seconds", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OOd", names, &HotStateType, &state, &PyType_Type, &ndarray,
                                     &in_python, &after, &yield_seconds) ||
        !hot_ready((HotState *)state))
        return -1;
    Py_XSETREF(self->state, (HotState *)Py_NewRef(state));
    Py_XSETREF(self->ndarray, (PyTypeObject *)Py_NewRef(ndarray));
    Py_XSETREF(self->in_python, Py_NewRef(in_python));
    Py_XSETREF(self->after, Py_NewRef(after));
    self->yield_seconds = yield_seconds;
    return 0;
}

static int shortcut_traverse(Shortcut *self, visitproc visit, void *arg) {
    PyObject *held[] = {(PyObject *)self->state, (PyObject *)self->ndarray, self->in_python, self->after,
                        (PyObject *)self->memo};
    for (int i = 0; i < 5; i++)
        Py_VISIT(held[i]);
    for (int i = 0; i < MEMO_ARGS; i++)
        Py_VISIT(self->memo_args[i]);
    return 0;
}

static int shortcut_clear(Shortcut *self) {
    PyObject **held[] = {(PyObject **)&self->state, (PyObject **)&self->ndarray, &self->in_python, &self->after,
                         (PyObject **)&self->memo};
    for (int i = 0; i < 5; i++)
        Py_CLEAR(*held[i]);
    for (int i = 0; i < MEMO_ARGS; i++)
        Py_CLEAR(self->memo_args[i]);
    Py_CLEAR(self->memo_arrays[0].descr);
    Py_CLEAR(self->memo_arrays[1].descr);
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
    .tp_doc = "Shortcut(state, ndarray, in_python, after, yield_seconds): a blocking call "
              "whose schedule is compiled and cached, run without entering Python",
    .tp_new = shortcut_new,
    .tp_init = (initproc)shortcut_init,
    .tp_dealloc = (destructor)shortcut_dealloc,
    .tp_traverse = (traverseproc)shortcut_traverse,
    .tp_clear = (inquiry)shortcut_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Shortcut, vectorcall),
};

/*
 * A persistent request's start() and wait() in C (requests.PersistentRequest, native.persistent_shortcut).
 *
 *   req.start() ─► the communicator usable, the owner thread, nothing in flight, the request free
 *                  to start, its program live (and no MPIRING_CHECK: not made then)
 *       yes ─► the call count and traffic ─► the prologue, exchange 0 started ─► in flight
 *                  └── an MPI error or raising work ─► failed_start(code or error): Python raises
 *       no  ─► start_in_python()
 *   req.wait() ─► from the owner thread (checked first), started, no error, and complete or alone in flight
 *       yes ─► the rest of the run ─► the program's result
 *                  └── stopped waiting, a wrong size, an MPI error ─► resume_wait(stopped)
 *       no  ─► wait_in_python()
 *
 * The same decisions and state changes as the Python methods' lean paths. The communicator's
 * state is its HotState's fields, the request's own its RequestFields' (PersistentRequest
 * subclasses that type); its call's step and number are written at __slots__ offsets found once
 * when it is made, and its methods are given then. The program stays bound to the request's
 * arrays for life.
 */

/* A persistent request's fields that its C start and wait read and write, as C fields
   (requests.PersistentRequest subclasses this; mpiring.engine.state has the Python form). */
typedef struct {
    PyObject_HEAD
    char freed, running;  /* freed by free(); a run started and not yet complete */
    Py_ssize_t position;  /* a recorded run: the exchange in flight (-1: never started) */
    PyObject *error;      /* what the last run raised, or None */
    PyObject *run;        /* a generator-driven run (a CollectiveRequest), or None */
} RequestFields;

static PyObject *request_fields_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    RequestFields *self = (RequestFields *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->position = -1;
        self->error = Py_NewRef(Py_None);
        self->run = Py_NewRef(Py_None);
    }
    return (PyObject *)self;
}

static int request_fields_traverse(RequestFields *self, visitproc visit, void *arg) {
    Py_VISIT(self->error);
    Py_VISIT(self->run);
    return 0;
}

static int request_fields_clear(RequestFields *self) {
    Py_CLEAR(self->error);
    Py_CLEAR(self->run);
    return 0;
}

static void request_fields_dealloc(RequestFields *self) {
    PyObject_GC_UnTrack(self);
    request_fields_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef request_fields_members[] = {
    {"_freed", T_BOOL, offsetof(RequestFields, freed), 0, "whether free() was called"},
    {"_running", T_BOOL, offsetof(RequestFields, running), 0, "a run started and not yet complete"},
    {"_position", T_PYSSIZET, offsetof(RequestFields, position), 0, "the exchange in flight (-1: never started)"},
    {"_error", T_OBJECT, offsetof(RequestFields, error), 0, "what the last run raised, or None"},
    {"_run", T_OBJECT, offsetof(RequestFields, run), 0, "a generator-driven run, or None"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RequestFieldsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpiring.engine._replay.RequestFields",
    .tp_basicsize = sizeof(RequestFields),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A persistent request's fields that its C start and wait read, as C fields",
    .tp_new = request_fields_new,
    .tp_dealloc = (destructor)request_fields_dealloc,
    .tp_traverse = (traverseproc)request_fields_traverse,
    .tp_clear = (inquiry)request_fields_clear,
    .tp_members = request_fields_members,
};

/* None, or a field never set (NULL) */
static int none(PyObject *field) {
    return field == NULL || field == Py_None;
}
/* the request's own methods, given in this order (PersistentRequest.take_shortcut) */
enum { IN_PYTHON_START, IN_PYTHON_WAIT, FAILED_START, RESUME_WAIT, HANDLERS };

/* A bound array's fields when the request was made (ArrayHead): its memory is the program's root. */
enum { BOUND_DIMS = 8 };
typedef struct {
    int state; /* BOUND_NONE: no array; BOUND_SEEN: as below; BOUND_UNSEEN: not readable here (Python checks) */
    int nd, flags;
    Py_ssize_t shape[BOUND_DIMS];
    PyObject *descr; /* held */
} Bound;
enum { BOUND_NONE, BOUND_SEEN, BOUND_UNSEEN };
enum { BOUND_FLAGS = ARRAY_C_CONTIGUOUS | ARRAY_WRITEABLE };

typedef struct {
    PyObject_HEAD
    RequestFields *request;       /* the request itself */
    PyObject *program, *call;
    HotState *state;              /* the communicator's: its thread, calls, traffic, in flight, freed, broken */
    PyObject *handlers[HANDLERS]; /* the request's own methods, bound */
    double spin;                  /* as PersistentRequest._spin */
    Py_ssize_t step_at, number_at; /* where the call keeps its step and number */
    Bound bound[2];               /* x and out as the program was bound to them */
} Persistent;

/* Root 0 (x) or 1 (out) of `p` as it is now, kept in `bound` (a request being made). */
static void keep_root(Program *p, int root, Bound *bound) {
    PyObject *array = root ? p->out : p->x;
    bound->state = array == NULL || array == Py_None ? BOUND_NONE : BOUND_UNSEEN;
    if (bound->state == BOUND_NONE || Py_TYPE(array) != readable_arrays)
        return;
    const ArrayHead *a = (const ArrayHead *)array;
    if (a->data != p->base[root] || a->nd > BOUND_DIMS)
        return;
    bound->state = BOUND_SEEN;
    bound->nd = a->nd;
    bound->flags = a->flags & BOUND_FLAGS;
    memcpy(bound->shape, a->dimensions, sizeof(Py_ssize_t) * a->nd);
    Py_XSETREF(bound->descr, Py_NewRef(a->descr));
}

/* Whether root `root` is still as `bound` keeps it: its memory, flags, shape and dtype. */
static int root_unchanged(Program *p, int root, const Bound *bound) {
    PyObject *array = root ? p->out : p->x;
    if (bound->state != BOUND_SEEN)
        return bound->state == BOUND_NONE && (array == NULL || array == Py_None);
    const ArrayHead *a = (const ArrayHead *)array;
    return a->data == p->base[root] && (a->flags & BOUND_FLAGS) == bound->flags && a->nd == bound->nd &&
           a->descr == bound->descr && memcmp(a->dimensions, bound->shape, sizeof(Py_ssize_t) * a->nd) == 0;
}

/* Whether the request's arrays are still those its program was bound to (else Python's start
   refuses the run, naming what changed); a program without roots (a device plan) always asks Python. */
static int still_bound(Persistent *self) {
    Program *p = (Program *)self->program;
    return p->nroots >= 2 && root_unchanged(p, 0, &self->bound[0]) && root_unchanged(p, 1, &self->bound[1]);
}

/* The communicator not freed and its ring not broken (Engine._usable). */
static int usable(const HotState *state) {
    return state->freed == Py_False && state->broken == Py_None;
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
    RequestFields *request = self->request;
    Program *program = (Program *)self->program;
    HotState *state = self->state;
    if (!hot_live(state))
        return in_python(self, IN_PYTHON_START);
    long long calls = calls_now(state);
    if (request->freed || request->running || PyList_GET_SIZE(state->in_flight) || program->exchanges == NULL ||
        !usable(state) || !owned(state) || calls < 0 || !still_bound(self))
        return in_python(self, IN_PYTHON_START);
    PyObject *now = count_to(state, calls + 1);
    if (now == NULL)
        return NULL;
    number_call(program, calls + 1); /* the notice this run looks for at its end */
    set_field(self->call, self->number_at, now);
    Py_DECREF(now);
    set_field(self->call, self->step_at, zero);
    request->running = 1;
    Py_XSETREF(request->error, Py_NewRef(Py_None));
    add_counters(state->traffic, program->traffic);
    request->position = 0;
    int code = begin(program);
    if (code) {
        PyObject *failure = code < 0 ? caught() : PyLong_FromLong(code);
        PyObject *result = failure ? PyObject_CallOneArg(self->handlers[FAILED_START], failure) : NULL;
        Py_XDECREF(failure);
        return result;
    }
    if (program->length == 0)
        request->running = 0;
    else if (PyList_Append(state->in_flight, (PyObject *)request) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *persistent_wait(Persistent *self, PyObject *unused) {
    if (!made(self))
        return NULL;
    RequestFields *request = self->request;
    Program *program = (Program *)self->program;
    if (!hot_live(self->state) || request->position < 0 || !none(request->error) || !none(request->run) ||
        !owned(self->state))
        return in_python(self, IN_PYTHON_WAIT);
    if (request->running) {
        PyObject *in_flight = self->state->in_flight;
        if (PyList_GET_SIZE(in_flight) != 1 || PyList_GET_ITEM(in_flight, 0) != (PyObject *)request ||
            program->exchanges == NULL)
            return in_python(self, IN_PYTHON_WAIT);
        if (PyList_SetSlice(in_flight, 0, 1, NULL) < 0)
            return NULL;
        request->running = 0;
        PyObject *stopped = run_from(program, request->position, 1, self->spin);
        if (stopped == NULL) /* recorded work raised: as in Python, the error goes to the caller */
            return NULL;
        if (stopped == Py_None && notice_waiting(program)) { /* Python raises, naming the peer */
            Py_DECREF(stopped);
            stopped = Py_BuildValue("(nii)", program->length, STOPPED_NOTICE, 0);
            if (stopped == NULL)
                return NULL;
        }
        if (stopped != Py_None) {
            PyObject *result = PyObject_CallOneArg(self->handlers[RESUME_WAIT], stopped);
            Py_DECREF(stopped);
            return result;
        }
        Py_DECREF(stopped);
    }
    return result_of(program);
}

/* PersistentShortcut(request, state, program, call, spin, handlers): handlers are the request's
   _start_in_python, _wait_in_python, _failed_start and _resume_wait, in that order. */
static int persistent_init(Persistent *self, PyObject *args, PyObject *kwds) {
    PyObject *request, *state, *program, *call, *handlers;
    double spin;
    static char *names[] = {"request", "state", "program", "call", "spin", "handlers", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!OdO!", names, &RequestFieldsType, &request, &HotStateType,
                                     &state, &ProgramType, &program, &call, &spin, &PyTuple_Type, &handlers) ||
        !hot_ready((HotState *)state))
        return -1;
    if (PyTuple_GET_SIZE(handlers) != HANDLERS) {
        PyErr_SetString(PyExc_TypeError, "handlers: the request's four methods");
        return -1;
    }
    /* the call's own fields, by __slots__ offset (found once, here) */
    if ((self->step_at = slot_offset(Py_TYPE(call), "step")) < 0 ||
        (self->number_at = slot_offset(Py_TYPE(call), "number")) < 0)
        return -1;
    PyObject **slots[] = {(PyObject **)&self->request, (PyObject **)&self->state, &self->program, &self->call};
    PyObject *given[] = {request, state, program, call};
    for (int i = 0; i < 4; i++)
        Py_XSETREF(*slots[i], Py_NewRef(given[i]));
    for (int i = 0; i < HANDLERS; i++)
        Py_XSETREF(self->handlers[i], Py_NewRef(PyTuple_GET_ITEM(handlers, i)));
    self->spin = spin;
    Program *p = (Program *)program;
    for (int root = 0; root < 2; root++)
        if (p->nroots >= 2)
            keep_root(p, root, &self->bound[root]);
        else
            self->bound[root].state = BOUND_UNSEEN;
    return 0;
}

static int persistent_traverse(Persistent *self, visitproc visit, void *arg) {
    PyObject *held[] = {(PyObject *)self->request, (PyObject *)self->state, self->program, self->call};
    for (int i = 0; i < 4; i++)
        Py_VISIT(held[i]);
    for (int i = 0; i < HANDLERS; i++)
        Py_VISIT(self->handlers[i]);
    return 0;
}

static int persistent_clear(Persistent *self) {
    PyObject **held[] = {(PyObject **)&self->request, (PyObject **)&self->state, &self->program, &self->call};
    for (int i = 0; i < 4; i++)
        Py_CLEAR(*held[i]);
    for (int i = 0; i < HANDLERS; i++)
        Py_CLEAR(self->handlers[i]);
    for (int root = 0; root < 2; root++)
        Py_CLEAR(self->bound[root].descr);
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
    .tp_doc = "PersistentShortcut(request, state, program, call, spin, handlers): a compiled persistent "
              "request's start() and wait() in C where its lean path holds, else its own methods",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)persistent_init,
    .tp_dealloc = (destructor)persistent_dealloc,
    .tp_traverse = (traverseproc)persistent_traverse,
    .tp_clear = (inquiry)persistent_clear,
    .tp_methods = persistent_methods,
};

/* bind(startall, testall, waitall, get_count, isend, irecv, iprobe, request_size, status_size,
   datatype_size, request_offset, byte_type, any_source); a communicator's handle has the
   datatype's size (native.py checks). */
static PyObject *bind(PyObject *module, PyObject *args) {
    unsigned long long startall, testall, waitall, count, isend_address, irecv_address, iprobe_address, byte_type;
    Py_ssize_t request_size, status_size, datatype_size, request_offset;
    int any_source;
    if (!PyArg_ParseTuple(args, "KKKKKKKnnnnKi", &startall, &testall, &waitall, &count, &isend_address,
                          &irecv_address, &iprobe_address, &request_size, &status_size, &datatype_size,
                          &request_offset, &byte_type, &any_source))
        return NULL;
    if (!startall || !testall || !waitall || !count || !isend_address || !irecv_address || !iprobe_address ||
        request_size <= 0 ||
        status_size <= 0 || request_offset <= 0 ||
        (datatype_size != (Py_ssize_t)sizeof(int) && datatype_size != (Py_ssize_t)sizeof(void *))) {
        PyErr_SetString(PyExc_ValueError, "bind(): an MPI function is missing or a handle size is unknown");
        return NULL;
    }
    mpi.startall = (startall_fn)(uintptr_t)startall;
    mpi.testall = (testall_fn)(uintptr_t)testall;
    mpi.waitall = (waitall_fn)(uintptr_t)waitall;
    mpi.get_count = (void *)(uintptr_t)count;
    mpi.isend = (void *)(uintptr_t)isend_address;
    mpi.irecv = (void *)(uintptr_t)irecv_address;
    mpi.iprobe = (void *)(uintptr_t)iprobe_address;
    mpi.any_source = any_source;
    mpi.request_size = request_size;
    mpi.status_size = status_size;
    mpi.datatype_size = datatype_size;
    mpi.request_offset = request_offset;
    mpi.byte_type = (intptr_t)byte_type;
    mpi.bound = 1;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS, "bind(startall, testall, waitall, get_count, isend, irecv, iprobe, request_size, "
                                 "status_size, datatype_size, request_offset, byte_type, any_source): the MPI "
                                 "library's functions, handle sizes and constants"},
    {"supports", supports, METH_VARARGS, "supports(op, dtype): whether WORK_OP with these codes runs here"},
    {"read_arrays", read_arrays, METH_O, "read_arrays(samples): whether NumPy arrays' fields are where this file "
                                         "reads them (then they are read directly)"},
    {"spec_tables", spec_tables, METH_VARARGS, "spec_tables(datatypes, dtypes): the tables spec_items reads"},
    {"spec_items", (PyCFunction)(void (*)(void))spec_items, METH_FASTCALL,
     "spec_items(spec, blocks): a buffer spec's elements for its common forms, else None"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_replay", "Schedules replayed in C (mpiring.engine.native).", -1, module_methods,
};

/* NumPy's attribute names (the Shortcut's key reads an array's dtype and shape; spec_items takes a view) */
static int intern_names(void) {
    return (s_shape = PyUnicode_InternFromString("shape")) && (s_dtype = PyUnicode_InternFromString("dtype")) &&
                   (s_view = PyUnicode_InternFromString("view")) && (zero = PyLong_FromLong(0))
               ? 0
               : -1;
}

PyMODINIT_FUNC PyInit__replay(void) {
    if (PyType_Ready(&CountersType) < 0 || PyType_Ready(&HotStateType) < 0 || PyType_Ready(&ProgramType) < 0 ||
        PyType_Ready(&ShortcutType) < 0 || PyType_Ready(&RequestFieldsType) < 0 || PyType_Ready(&PersistentType) < 0 ||
        intern_names() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Counters", (PyObject *)&CountersType) < 0 ||
        PyModule_AddObjectRef(m, "HotState", (PyObject *)&HotStateType) < 0 ||
        PyModule_AddObjectRef(m, "Program", (PyObject *)&ProgramType) < 0 ||
        PyModule_AddObjectRef(m, "Shortcut", (PyObject *)&ShortcutType) < 0 ||
        PyModule_AddObjectRef(m, "PersistentShortcut", (PyObject *)&PersistentType) < 0 ||
        PyModule_AddObjectRef(m, "RequestFields", (PyObject *)&RequestFieldsType) < 0 ||
        PyModule_AddIntConstant(m, "WORK_COPY", WORK_COPY) < 0 || PyModule_AddIntConstant(m, "WORK_OP", WORK_OP) < 0 ||
        PyModule_AddIntConstant(m, "WORK_DIVIDE", WORK_DIVIDE) < 0 ||
        PyModule_AddIntConstant(m, "WORK_EXPECT", WORK_EXPECT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
