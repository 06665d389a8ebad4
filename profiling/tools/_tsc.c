/* Cycle counts (rdtsc) of calls to one callable (profiling only: breakdown_record.py times the
   recorder's C hot path with it, without a Python frame or a timer call of its own around it).

   set(target); call(*args) -> target(*args), its cycles added up; take() -> (cycles, calls) since
   the last take, and resets them. x86-64 only (elsewhere, import of the built module fails and the
   caller says so). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <x86intrin.h>

static PyObject *target;
static unsigned long long cycles, calls;

static PyObject *call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (target == NULL) { PyErr_SetString(PyExc_RuntimeError, "_tsc.set(target) first"); return NULL; }
    unsigned long long t0 = __rdtsc();
    PyObject *r = PyObject_Vectorcall(target, args, nargs, NULL);
    cycles += __rdtsc() - t0;
    calls++;
    return r;
}

static PyObject *set(PyObject *self, PyObject *t) { Py_XSETREF(target, Py_NewRef(t)); Py_RETURN_NONE; }

static PyObject *take(PyObject *self, PyObject *unused) {
    PyObject *r = Py_BuildValue("(KK)", cycles, calls);
    cycles = calls = 0;
    return r;
}

static PyObject *now(PyObject *self, PyObject *unused) { return PyLong_FromUnsignedLongLong(__rdtsc()); }

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))call, METH_FASTCALL, "target(*args), timed"},
    {"set", set, METH_O, "set(target)"},
    {"take", take, METH_NOARGS, "(cycles, calls) since the last take"},
    {"now", now, METH_NOARGS, "the time stamp counter"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_tsc", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tsc(void) { return PyModule_Create(&moddef); }
