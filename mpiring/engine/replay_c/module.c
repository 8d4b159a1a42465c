/*
 * The module mpiring.engine._replay: its functions and types registered, the names it interns.
 * replay.h describes the whole and names each file's role.
 */
#include "replay.h"

PyObject *s_shape, *s_dtype, *s_view, *s_copy;

static PyMethodDef module_methods[] = {
    {"bind", bind_library, METH_VARARGS,
     "bind(startall, testall, waitall, get_count, isend, irecv, iprobe, request_size, status_size, datatype_size, "
     "request_offset, byte_type, any_source): the MPI library's functions, handle sizes and constants"},
    {"supports", supports, METH_VARARGS, "supports(op, dtype): whether WORK_OP with these codes runs here"},
    {"read_arrays", read_arrays, METH_O, "read_arrays(samples): whether NumPy arrays' fields are where this module "
                                         "reads them (then they are read directly)"},
    {"spec_tables", spec_tables, METH_VARARGS, "spec_tables(datatypes, dtypes, byte_buffers, frombuffer): the tables spec_items reads"},
    {"spec_items", (PyCFunction)(void (*)(void))spec_items, METH_FASTCALL,
     "spec_items(spec, blocks): a buffer spec's elements for its common forms, else None"},
    {"dropin_tables", dropin_tables, METH_VARARGS, "dropin_tables(ops, in_place, empty, int_arrays, in_place_alltoall): the tables dropin_call reads"},
    {"dropin_call", (PyCFunction)(void (*)(void))dropin_call, METH_FASTCALL,
     "dropin_call(kind, sendbuf, recvbuf, op, root, (rank, size), run): run(...) with the engine's blocking "
     "run's arguments for the common forms of an uppercase call, else NotImplemented"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_replay", "Schedules replayed in C (mpiring.engine.native).", -1, module_methods,
};

/* NumPy's attribute names (the Shortcut's key reads an array's dtype and shape and may copy an
   array; spec_items takes a view) */
static int intern_names(void) {
    return (s_shape = PyUnicode_InternFromString("shape")) && (s_dtype = PyUnicode_InternFromString("dtype")) &&
                   (s_view = PyUnicode_InternFromString("view")) && (s_copy = PyUnicode_InternFromString("copy"))
               ? 0
               : -1;
}

PyMODINIT_FUNC PyInit__replay(void) {
    if (PyType_Ready(&CountersType) < 0 || PyType_Ready(&HotStateType) < 0 || PyType_Ready(&ProgramType) < 0 ||
        PyType_Ready(&ShortcutType) < 0 || PyType_Ready(&RequestFieldsType) < 0 || PyType_Ready(&CallFieldsType) < 0 ||
        PyType_Ready(&PersistentType) < 0 || intern_names() < 0)
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
        PyModule_AddObjectRef(m, "CallFields", (PyObject *)&CallFieldsType) < 0 ||
        PyModule_AddIntConstant(m, "WORK_COPY", WORK_COPY) < 0 || PyModule_AddIntConstant(m, "WORK_OP", WORK_OP) < 0 ||
        PyModule_AddIntConstant(m, "WORK_DIVIDE", WORK_DIVIDE) < 0 ||
        PyModule_AddIntConstant(m, "WORK_EXPECT", WORK_EXPECT) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
