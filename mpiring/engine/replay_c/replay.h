/*
 * Schedules replayed in C (wrapped by mpiring/engine/native.py): the extension
 * mpiring.engine._replay, whose files share this header.
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
 *
 * The files, each one role (setup.py compiles them all into the one extension):
 *   replay.h      this header: the structs every file reads, the functions one file gives another
 *   module.c      the module: its functions and types registered, the names it interns
 *   mpi.c         bind(): the MPI library's functions and handle sizes; the calls whose handles differ
 *   hot_state.c   Counters (Traffic's fields) and HotState (a communicator's state every call reads)
 *   work.c        a schedule's work: read from Python's tuples, done between exchanges, NumPy's arithmetic
 *   program.c     Program: built from plain data, its arrays bound, released
 *   run.c         a Program run: its exchanges posted, waited for, checked, handed back to Python
 *   arrays.c      NumPy arrays' memory and fields, read without NumPy's headers
 *   specs.c       mpi4py's buffer specs in their common forms (spec_items)
 *   dropin.c      the drop-in's common blocking calls read into the engine's arguments (dropin_call)
 *   shortcut.c    Shortcut: a blocking call whose schedule is cached, taken without running Python
 *   persistent.c  a persistent request's start() and wait() in C (RequestFields, PersistentShortcut)
 *
 * What one file gives another is declared here and hidden from the extension's symbol table
 * (only PyInit__replay is exported), so no name here meets one of libc's, Python's or MPI's.
 */
#ifndef MPIRING_REPLAY_H
#define MPIRING_REPLAY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#pragma GCC visibility push(hidden)

/* ---- the MPI library (mpi.c) ---- */

typedef int (*startall_fn)(int, void *);
typedef int (*testall_fn)(int, void *, int *, void *);
typedef int (*waitall_fn)(int, void *, void *);

/* What `bind` was given: the MPI library's functions and its handle sizes. */
typedef struct {
    startall_fn startall;
    testall_fn testall;
    waitall_fn waitall;
    void *get_count, *isend, *irecv, *iprobe;
    intptr_t byte_type;
    int any_source;
    Py_ssize_t request_size, status_size, datatype_size;
    Py_ssize_t request_offset; /* where an mpi4py Request object keeps its handle */
    int bound;
} Library;

extern Library mpi;

/* bind(...): the module's function that fills `mpi` (native.py calls it once). */
PyObject *bind_library(PyObject *module, PyObject *args);
/* MPI_Get_count of a status in bytes. */
int byte_count(const void *status, int *count);
/* MPI_Irecv (receive) or MPI_Isend of `bytes` bytes at `buf` on communicator `comm`. */
int post_message(int receive, void *buf, int bytes, int peer, int tag, intptr_t comm, void *request);
/* MPI_Iprobe for a message of `tag` from any source on `comm`. */
int probe(int tag, intptr_t comm, int *flag, void *status);

/* ---- what a Program is made of ---- */

/* Why a run went back to Python: the tuple it returns is (exchange, reason, MPI error code). */
enum { STOPPED_WAITING = 0, STOPPED_SIZE = 1, STOPPED_ERROR = 2, STOPPED_CHANGED = 3, STOPPED_NOTICE = 4 };

/* Work: a Python callable, or what work.c does itself (native.py, `work_spec`). WORK_EXPECT
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

/* ---- a communicator's hot state, shared by Python and the C paths (hot_state.c) ----
 *
 * What every call reads or counts lives here, in C structs whose fields Python reads and writes
 * as members (Ring and Engine hold one HotState; mpiring.engine.state is the same in Python where
 * this extension was not built). The Shortcut and the persistent request take the object when
 * they are made and read its fields directly: no attribute is looked up by name on a call's path,
 * so renaming Python code cannot slow or break them. */

/* Traffic's fields (mpiring.engine.transport.Traffic subclasses this): what a communicator has
   handed to MPI, or what one run of a program hands it. */
typedef struct {
    PyObject_HEAD
    long long bytes_sent, bytes_received, messages;
} Counters;

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

extern PyTypeObject CountersType, HotStateType;

/* state.calls = `now` (a new reference to it, or NULL with an error) */
PyObject *count_to(HotState *state, long long now);
/* hot_live, else 0 with an error (a Shortcut or persistent request being made on it). */
int hot_ready(const HotState *state);

/* total += once, field by field */
static inline void add_counters(Counters *total, const Counters *once) {
    total->bytes_sent += once->bytes_sent;
    total->bytes_received += once->bytes_received;
    total->messages += once->messages;
}

/* 1: the calling thread is the one the state serves (HotState.served: the owner, while the
   communicator is usable); else 0. Every C way into a call checks this first, under the GIL,
   before it changes anything: a second thread goes to Python, which refuses it
   (ConcurrentUseError) without touching what a run of the owner's may be using while its waits
   let go of the GIL. */
static inline int owned(const HotState *state) {
    PyObject *served = state->served;
    return served != NULL && PyLong_CheckExact(served) && PyLong_AsUnsignedLong(served) == PyThread_get_thread_ident();
}

/* The call count now, if it is a plain int (else -1, a miss: Python counts that call). */
static inline long long calls_now(const HotState *state) {
    PyObject *calls = state->calls;
    long long now = calls != NULL && PyLong_CheckExact(calls) ? PyLong_AsLongLong(calls) : -1;
    if (now < 0)
        PyErr_Clear();
    return now;
}

/* 1: the state's objects are there; 0 before its __init__ ran, or once a garbage collection
   cleared it (a cycle's objects are cleared in any order: what holds it may still be called from
   a finalizer). The C paths then go to Python, which raises rather than crashes. */
static inline int hot_live(const HotState *state) {
    return state->in_flight != NULL && state->programs != NULL && state->traffic != NULL;
}

/* ---- Program: a schedule's C form (program.c builds it, run.c runs it) ---- */

typedef struct {
    PyObject_HEAD
    intptr_t comm;             /* the communicator's handle: the messages go there */
    intptr_t notice_comm;      /* where peers' notices come (their own communicator: a probe there never
                                  walks the queue of messages a root sent ahead) */
    char busy;                 /* spin without offering the core (the node has a core per rank) */
    int tag;                   /* the call's tag: a message's tag is this plus its own */
    int sequence_base, sequence_shift, sequence_mask; /* where the call's number goes in its tag (mask 0: none) */
    int notice;                /* the tag of a notice that a peer left a call of this generation (-1: none) */
    long long notice_key;      /* that call's key on the notice board (its tag and number) */
    PyObject *board;           /* the ranks' notice board (mpiring.engine.notice_board), kept alive; NULL: none */
    const long long *board_rows; /* its rows: board_ranks of board_slots keys each */
    int board_ranks, board_slots, board_rank;
    Py_ssize_t nroots;
    char **base;               /* roots: 0 and 1 bound per call (x, out), the rest the schedule's own */
    PyObject *owned;           /* the owned roots' arrays, kept alive */
    PyObject *x, *out;         /* the arrays bound now, for work done in Python (None between calls) */
    Py_ssize_t x_bytes, out_bytes; /* what a bound x and out must hold */
    Py_ssize_t own_offset;     /* where in out a bound x may lie (an in-place gather's own block; -1: apart only) */
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

extern PyTypeObject ProgramType;

static inline char *address(const Program *p, Ref ref) {
    return ref.root < 0 ? (char *)ref.offset : p->base[ref.root] + ref.offset;
}

/* program.c: let the bound arrays go */
void unbind(Program *self);

/* run.c: a run and what it hands back */
PyObject *run_from(Program *self, Py_ssize_t first, int started, double spin);
int begin(Program *self);
void number_call(Program *p, long long calls);
int notice_waiting(const Program *p);
PyObject *result_of(Program *p);
PyObject *caught(void);
/* the Program's methods run(), start() and begin() */
PyObject *program_run(Program *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *program_call(Program *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *program_start(Program *self, PyObject *index_object);
PyObject *program_begin(Program *self, PyObject *unused);

/* work.c: a schedule's work */
int parse_ref(PyObject *item, Ref *ref);                  /* a (root, offset) pair */
int check_ref(const Ref *ref, Py_ssize_t nroots);         /* -1 with an error: it names no root */
Work *work_init(PyObject *works, Py_ssize_t *n, Py_ssize_t nroots);
int do_work(const Program *p, const Work *work, Py_ssize_t n);
PyObject *supports(PyObject *module, PyObject *args);     /* the module's supports(op, dtype) */

/* ---- NumPy arrays read directly (arrays.c) ----
 *
 * The leading fields of a NumPy array object as numpy/ndarraytypes.h lays them out
 * (PyArrayObject_fields, the same from NumPy 1.7 to 2.x), read without NumPy's headers. They are
 * used only once `read_arrays` has found them where they should be in live arrays (native.py
 * asks when it binds the MPI library); until then, or if not, the buffer protocol serves. */
typedef struct {
    PyObject_HEAD
    char *data;
    int nd;
    Py_ssize_t *dimensions, *strides;
    PyObject *base, *descr;
    int flags;
} ArrayHead;
enum { ARRAY_C_CONTIGUOUS = 0x0001, ARRAY_WRITEABLE = 0x0400 };

extern PyTypeObject *readable_arrays; /* numpy.ndarray, once its fields were found where expected */

PyObject *read_arrays(PyObject *module, PyObject *samples);
char *memory_of(PyObject *array, Py_ssize_t bytes, Py_ssize_t items, int writable);

/* ---- mpi4py's buffer specs (specs.c) ---- */

PyObject *spec_tables(PyObject *module, PyObject *args);
PyObject *spec_items(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *spec_elements(PyObject *spec, Py_ssize_t blocks, int borrow);
void pin_buffer(PyObject *spec);
PyObject *own_block(PyObject *array, Py_ssize_t start, Py_ssize_t stop);

/* ---- the drop-in's common calls (dropin.c) ---- */

PyObject *dropin_tables(PyObject *module, PyObject *args);
PyObject *dropin_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* ---- the call paths taken in C (shortcut.c, persistent.c) ---- */

extern PyTypeObject ShortcutType, RequestFieldsType, CallFieldsType, PersistentType;

/* ---- the module (module.c) ---- */

/* NumPy's attribute names (the Shortcut's key reads an array's dtype and shape; spec_items takes
   a view), and the int 0 (a persistent run's first step) */
extern PyObject *s_shape, *s_dtype, *s_view, *s_copy;

#pragma GCC visibility pop

#endif
