/*
 * A Program run: each exchange's messages posted, waited for (MPI_Waitall, or MPI_Testall spun
 * for a while), its byte counts checked and its work done; where it cannot go on, the exchange
 * handed back to Python (replay.h says when). Also what the call paths take from a run: its
 * tags numbered, a peer's notice looked for, its result or the error its work raised.
 */
#include "replay.h"

#include <sched.h>
#include <time.h>

/* A peer left the call now numbered (a call that completed may have taken data that peer sent
   for the call it left): 1, else 0. Where the ranks share a notice board, its key there
   (mpiring.engine.notice_board); else its notice, by one MPI_Iprobe (an MPI error: 0, the run
   stands as a Python run would). */
int notice_waiting(const Program *p) {
    int flag = 0;
    char status[256];
    if (p->notice < 0)
        return 0;
    if (p->board_rows != NULL) {
        for (int rank = 0; rank < p->board_ranks; rank++) {
            const volatile long long *row = p->board_rows + (Py_ssize_t)rank * p->board_slots;
            for (int slot = 0; rank != p->board_rank && slot < p->board_slots; slot++)
                if (row[slot] == p->notice_key)
                    return 1;
        }
        return 0;
    }
    if (mpi.status_size > (Py_ssize_t)sizeof(status))
        return 0;
    probe(p->notice, p->notice_comm, &flag, status);
    return flag;
}

/* `tag` for the call numbered `calls` (blocking tags carry it, mpiring.engine.tags.with_sequence). */
static int numbered(const Program *p, int tag, long long calls) {
    int field = p->sequence_mask << p->sequence_shift, offset = tag - p->sequence_base;
    return p->sequence_base + ((offset & ~field) | (int)(calls & p->sequence_mask) << p->sequence_shift);
}

/* The program's tag (a blocking one: a persistent request's carries no number), and the notice
   it looks for, for the call numbered `calls`. */
void number_call(Program *p, long long calls) {
    if (p->sequence_mask && p->tag >= p->sequence_base)
        p->tag = numbered(p, p->tag, calls);
    if (p->sequence_mask && p->notice >= 0)
        p->notice = numbered(p, p->notice, calls);
    if (p->notice >= 0)
        p->notice_key = (long long)p->notice << 32 | (calls & 0xFFFFFFFFLL); /* notice_board.key */
}

/* Post one message made anew: at its root's base + offset, its tag the call's plus its own. */
static int post(const Program *p, const Message *m, void *request) {
    return post_message(m->receive, address(p, m->buf), m->bytes, m->peer, p->tag + m->tag, p->comm, request);
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
   done, else (exchange, reason, code): see replay.h. */
PyObject *run_from(Program *self, Py_ssize_t first, int started, double spin) {
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
            code = byte_count(e->statuses + e->check_index[i] * mpi.status_size, &count);
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

PyObject *program_run(Program *self, PyObject *const *args, Py_ssize_t nargs) {
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
PyObject *program_start(Program *self, PyObject *index_object) {
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
int begin(Program *self) {
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

PyObject *program_begin(Program *self, PyObject *unused) {
    if (self->exchanges == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "this program was released");
        return NULL;
    }
    int code = begin(self);
    return code < 0 ? NULL : PyLong_FromLong(code);
}

/* The exception being raised, with its traceback, taken (a new reference; the error indicator is clear). */
PyObject *caught(void) {
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
PyObject *result_of(Program *p) {
    if (p->result == RESULT_OUT)
        return Py_NewRef(p->out);
    if (p->result == RESULT_X)
        return Py_NewRef(p->x);
    Py_RETURN_NONE;
}
