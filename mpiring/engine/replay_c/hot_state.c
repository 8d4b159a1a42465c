/*
 * A communicator's hot state as C types: Counters (Traffic's fields: what a communicator, or one
 * run of a program, hands to MPI) and HotState (what every call reads or counts; replay.h has its
 * fields). Python reads and writes both as members; the Shortcut and the persistent request read
 * them directly.
 */
#include "replay.h"

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

PyTypeObject CountersType = {
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

enum { HOT_FIELDS = 9 }; /* all held */

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

PyTypeObject HotStateType = {
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

/* state.calls = `now` (a new reference to it, or NULL with an error) */
PyObject *count_to(HotState *state, long long now) {
    PyObject *number = PyLong_FromLongLong(now);
    if (number != NULL)
        Py_XSETREF(state->calls, Py_NewRef(number));
    return number;
}

/* hot_live, else 0 with an error (a Shortcut or persistent request being made on it). */
int hot_ready(const HotState *state) {
    if (!hot_live(state))
        PyErr_SetString(PyExc_TypeError, "a HotState used before it was made (__init__)");
    return hot_live(state);
}
