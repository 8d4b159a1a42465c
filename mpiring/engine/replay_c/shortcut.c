/*
 * Shortcut: a blocking host call whose schedule is cached, taken without running Python
 * (engine/engine.py).
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
#include "replay.h"

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

/* Bind x and out (or a new result) to the program; 0, or -1 (an error set) on a miss. An x inside
   out (an in-place gather's own block) is bound where it lies at the program's own_offset, and
   elsewhere a copy of it apart is, as it was recorded (Engine._on_host_arrays does the same). */
static int bind_call(Program *p, PyObject *x, PyObject *out) {
    char *x_memory = NULL, *out_memory = NULL;
    PyObject *result = NULL, *apart = NULL;
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
            out_memory < x_memory + p->x_bytes && !(p->own_offset >= 0 && x_memory == out_memory + p->own_offset)) {
            if (x_memory < out_memory || x_memory + p->x_bytes > out_memory + p->out_bytes || p->result == RESULT_X ||
                (apart = PyObject_CallMethodNoArgs(x, s_copy)) == NULL ||
                (x_memory = memory_of(apart, p->x_bytes, p->x_items, 0)) == NULL) {
                Py_XDECREF(apart);
                PyErr_SetString(PyExc_ValueError, "x and out overlap without x lying inside out");
                return -1;
            }
            x = apart;
        }
        result = Py_NewRef(out);
    }
    Py_XSETREF(p->x, apart ? apart : Py_NewRef(x));
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

/* A cached call whose arrays `program` holds now (bind_call), counted and run: its result, or what
   `after(program, stopped, spin, error)` makes of a run that stopped or raised; unbound after. */
static PyObject *run_bound_call(HotState *state, Program *program, double spin, PyObject *after) {
    PyObject *result = NULL;
    Py_INCREF(program); /* a work callable could drop it from the table */
    PyObject *stopped = count_call(state, program) == 0 ? run_from(program, 0, 0, spin) : NULL;
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
            result = PyObject_CallFunctionObjArgs(after, (PyObject *)program, stopped ? stopped : Py_None,
                                                  spin_object, error ? error : Py_None, NULL);
        Py_XDECREF(spin_object);
        Py_XDECREF(error);
    }
    Py_XDECREF(stopped);
    unbind(program);
    Py_DECREF(program);
    return result;
}

static PyObject *shortcut_call(Shortcut *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    double spin = -1.0;
    Program *program = NULL;
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
    return run_bound_call(self->state, program, spin, self->after);
}

/* Program.call(state, x, out, spin, after): a cached call that Python found (Engine._replay), run
   as the Shortcut runs its hits: bound, counted in `state`, run, its result or after's;
   NotImplemented, with nothing changed, where x and out cannot be bound here. */
PyObject *program_call(Program *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyObject_TypeCheck(args[0], &HotStateType)) {
        PyErr_SetString(PyExc_TypeError, "call(state, x, out, spin, after)");
        return NULL;
    }
    double spin = PyFloat_AsDouble(args[3]);
    if (spin == -1.0 && PyErr_Occurred())
        return NULL;
    if (self->exchanges == NULL || self->nroots < 2 || bind_call(self, args[1], args[2]) < 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    return run_bound_call((HotState *)args[0], self, spin, args[4]);
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

PyTypeObject ShortcutType = {
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
