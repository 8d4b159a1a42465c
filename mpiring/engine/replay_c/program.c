/*
 * Program: a recorded schedule's C form (replay.h has its fields), built from the plain data
 * native.py gives; its arrays bound (`bind`, or the Shortcut's bind_call) and let go, its
 * memory released. run.c runs it.
 */
#include "replay.h"

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
    Py_CLEAR(self->board);
    self->board_rows = NULL;
}

static int program_traverse(Program *self, visitproc visit, void *arg) {
    Py_VISIT(self->prologue);
    Py_VISIT(self->owned);
    Py_VISIT(self->x);
    Py_VISIT(self->out);
    Py_VISIT(self->allocate);
    Py_VISIT(self->traffic);
    Py_VISIT(self->schedule);
    Py_VISIT(self->board);
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
   traffic, schedule, sequence=(base, shift, mask), notice=-1, items=(-1, -1), notice_comm=comm, own_offset=-1,
   board=None): roots: a tuple of root addresses (0 and 1 placeholders, bound per call); board: the
   notice board as (its object, its rows' address, ranks, slots, this rank), or None. */
static int program_init(Program *self, PyObject *args, PyObject *kwds) {
    PyObject *prologue, *specs, *roots, *owned, *allocate, *traffic, *schedule;
    unsigned long long comm, notice_comm = 0;
    int busy = 0, tag = 0, result = RESULT_NONE, base = 0, shift = 0, mask = 0, notice = -1;
    Py_ssize_t x_bytes = 0, out_bytes = 0, x_items = -1, out_items = -1, own_offset = -1;
    PyObject *board = Py_None;
    static char *names[] = {"prologue", "exchanges", "comm", "busy", "tag", "roots", "owned", "x_bytes",
                            "out_bytes", "allocate", "result", "traffic", "schedule", "sequence", "notice",
                            "items", "notice_comm", "own_offset", "board", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!KpiO!OnnOiO!O|(iii)i(nn)KnO", names, &PyTuple_Type, &prologue,
                                     &PyTuple_Type, &specs, &comm, &busy, &tag, &PyTuple_Type, &roots, &owned, &x_bytes,
                                     &out_bytes, &allocate, &result, &CountersType, &traffic, &schedule, &base, &shift, &mask,
                                     &notice, &x_items, &out_items, &notice_comm, &own_offset, &board))
        return -1;
    PyObject *board_object = NULL;
    unsigned long long board_rows = 0;
    int board_ranks = 0, board_slots = 0, board_rank = -1;
    if (board != Py_None && !PyArg_ParseTuple(board, "OKiii;board: (object, address, ranks, slots, rank)", &board_object,
                                              &board_rows, &board_ranks, &board_slots, &board_rank))
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
    self->notice_key = -1;
    if (board_object != NULL && board_rows) {
        self->board = Py_NewRef(board_object);
        self->board_rows = (const long long *)(uintptr_t)board_rows;
        self->board_ranks = board_ranks;
        self->board_slots = board_slots;
        self->board_rank = board_rank;
    }
    self->result = result;
    self->x_bytes = x_bytes;
    self->out_bytes = out_bytes;
    self->own_offset = own_offset;
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

/* bind(x, out, x_address, out_address): the arrays a run works on, as Python checked them (the
   Shortcut binds in C); unbind(): let them go. */

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

void unbind(Program *self) {
    Py_XSETREF(self->x, Py_NewRef(Py_None));
    Py_XSETREF(self->out, Py_NewRef(Py_None));
}

static PyObject *program_unbind(Program *self, PyObject *unused) {
    unbind(self);
    Py_RETURN_NONE;
}

static PyObject *program_release(Program *self, PyObject *unused) {
    program_clear(self);
    Py_RETURN_NONE;
}

static PyMethodDef program_methods[] = {
    {"run", (PyCFunction)(void (*)(void))program_run, METH_FASTCALL,
     "run(first, started, spin): None when done, else (exchange, reason, MPI error code)"},
    {"call", (PyCFunction)(void (*)(void))program_call, METH_FASTCALL,
     "call(state, x, out, spin, after): a cached call Python found, bound, counted and run as the Shortcut "
     "runs one; NotImplemented where x and out cannot be bound"},
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

PyTypeObject ProgramType = {
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
