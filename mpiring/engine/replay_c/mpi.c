/*
 * The MPI library: bind() takes its functions and handle sizes from native.py, which finds them
 * in the library mpi4py loaded. A datatype or communicator handle is an int in MPICH and a
 * pointer in Open MPI, so the calls that pass one are made here, in the form the library takes.
 */
#include "replay.h"

typedef int (*get_count_int_fn)(const void *, int, int *);          /* MPICH: MPI_Datatype is an int */
typedef int (*get_count_pointer_fn)(const void *, void *, int *);   /* Open MPI: a pointer */
typedef int (*message_int_fn)(void *, int, int, int, int, int, void *);         /* MPI_Isend, MPI_Irecv */
typedef int (*message_pointer_fn)(void *, int, void *, int, int, void *, void *);
typedef int (*iprobe_int_fn)(int, int, int, int *, void *);                       /* MPI_Iprobe */
typedef int (*iprobe_pointer_fn)(int, int, void *, int *, void *);

Library mpi;

int byte_count(const void *status, int *count) {
    if (mpi.datatype_size == (Py_ssize_t)sizeof(int))
        return ((get_count_int_fn)mpi.get_count)(status, (int)mpi.byte_type, count);
    return ((get_count_pointer_fn)mpi.get_count)(status, (void *)mpi.byte_type, count);
}

int post_message(int receive, void *buf, int bytes, int peer, int tag, intptr_t comm, void *request) {
    void *function = receive ? mpi.irecv : mpi.isend;
    if (mpi.datatype_size == (Py_ssize_t)sizeof(int))
        return ((message_int_fn)function)(buf, bytes, (int)mpi.byte_type, peer, tag, (int)comm, request);
    return ((message_pointer_fn)function)(buf, bytes, (void *)mpi.byte_type, peer, tag, (void *)comm, request);
}

int probe(int tag, intptr_t comm, int *flag, void *status) {
    if (mpi.datatype_size == (Py_ssize_t)sizeof(int))
        return ((iprobe_int_fn)mpi.iprobe)(mpi.any_source, tag, (int)comm, flag, status);
    return ((iprobe_pointer_fn)mpi.iprobe)(mpi.any_source, tag, (void *)comm, flag, status);
}

/* bind(startall, testall, waitall, get_count, isend, irecv, iprobe, request_size, status_size,
   datatype_size, request_offset, byte_type, any_source); a communicator's handle has the
   datatype's size (native.py checks). */
PyObject *bind_library(PyObject *module, PyObject *args) {
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
