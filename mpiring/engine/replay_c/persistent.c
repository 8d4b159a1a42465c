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
 * subclasses that type), its call's step and number its CallFields' (transport.Call subclasses
 * that one); its methods are given when it is made. The program stays bound to the request's
 * arrays for life.
 */
#include "replay.h"

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

PyTypeObject RequestFieldsType = {
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

/* A call's fields that a persistent request's C start writes, as C fields (transport.Call
   subclasses this; mpiring.engine.state has the Python form). */
typedef struct {
    PyObject_HEAD
    Py_ssize_t step; /* steps completed so far */
    PyObject *number; /* a nonblocking call's or persistent run's number on the ring, or None (NULL) */
} CallFields;

static int call_fields_traverse(CallFields *self, visitproc visit, void *arg) {
    Py_VISIT(self->number);
    return 0;
}

static int call_fields_clear(CallFields *self) {
    Py_CLEAR(self->number);
    return 0;
}

static void call_fields_dealloc(CallFields *self) {
    PyObject_GC_UnTrack(self);
    call_fields_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef call_fields_members[] = {
    {"step", T_PYSSIZET, offsetof(CallFields, step), 0, "steps completed so far"},
    {"number", T_OBJECT, offsetof(CallFields, number), 0,
     "a nonblocking call's or persistent run's number on the ring (None: a blocking call)"},
    {NULL, 0, 0, 0, NULL},
};

PyTypeObject CallFieldsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mpiring.engine._replay.CallFields",
    .tp_basicsize = sizeof(CallFields),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A call's fields that a persistent request's C start writes, as C fields",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)call_fields_dealloc,
    .tp_traverse = (traverseproc)call_fields_traverse,
    .tp_clear = (inquiry)call_fields_clear,
    .tp_members = call_fields_members,
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
    PyObject *program;
    CallFields *call;             /* the request's call */
    HotState *state;              /* the communicator's: its thread, calls, traffic, in flight, freed, broken */
    PyObject *handlers[HANDLERS]; /* the request's own methods, bound */
    double spin;                  /* as PersistentRequest._spin */
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
    Py_XSETREF(self->call->number, now);
    self->call->step = 0;
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
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!O!dO!", names, &RequestFieldsType, &request,
                                     &HotStateType, &state, &ProgramType, &program, &CallFieldsType, &call, &spin,
                                     &PyTuple_Type, &handlers) ||
        !hot_ready((HotState *)state))
        return -1;
    if (PyTuple_GET_SIZE(handlers) != HANDLERS) {
        PyErr_SetString(PyExc_TypeError, "handlers: the request's four methods");
        return -1;
    }
    PyObject **slots[] = {(PyObject **)&self->request, (PyObject **)&self->state, &self->program,
                          (PyObject **)&self->call};
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
    PyObject *held[] = {(PyObject *)self->request, (PyObject *)self->state, self->program, (PyObject *)self->call};
    for (int i = 0; i < 4; i++)
        Py_VISIT(held[i]);
    for (int i = 0; i < HANDLERS; i++)
        Py_VISIT(self->handlers[i]);
    return 0;
}

static int persistent_clear(Persistent *self) {
    PyObject **held[] = {(PyObject **)&self->request, (PyObject **)&self->state, &self->program,
                         (PyObject **)&self->call};
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

PyTypeObject PersistentType = {
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
