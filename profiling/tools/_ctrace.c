/* The least an exact recorder can do per op in MindSpore 2.10, in C (profiling only:
   bench_record_overhead.py's `hooks+ctrace` and `ctrace-bare` configurations).

   Per op: the tensor arguments (a legacy primitive's `(prim, name, inputs)` unwrapped) are found by
   a C-level type check (PyObject_TypeCheck: no ABCMeta __instancecheck__, as the recorder avoids it
   too), each one's identity tag (its user data under `key`, an int) is read and stored in a
   preallocated C buffer together with the op's name, and each tensor result is tagged with a new
   int. No Python object is kept (nothing for the garbage collector to track), no normalisation,
   no types, no plans: a floor under any recorder built on MindSpore's per-C++-tensor user data,
   the only tensor identity that survives its fresh Python wrappers.

   setup(tensor_type, key) once; on_op(name, args, out) -> None; calls() -> ops traced so far.
   set_keep(n, keep): an experiment (bench_record_overhead.py --keep-objects): on_op also makes n
   4-tuples holding two new ints each (3n objects, about what the recorder makes per instruction
   for n = 3), kept in a list of up to 8192 (keep = 1) or freed at once (keep = 0). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define CAP (1 << 16)  /* entries of the buffer: a block's worth; it wraps around */

static PyTypeObject *TensorType_;
static PyObject *KEY_, *s_get, *s_set;
static intptr_t buf[CAP];
static Py_ssize_t pos;
static long long n_, calls_;
static int keep_n, keep_mode; static PyObject *KEEP_;

static void put(intptr_t v) { buf[pos] = v; pos = (pos + 1) & (CAP - 1); }

static int tag_result(PyObject *o) {
    PyObject *num = PyLong_FromLongLong(++n_);
    if (num == NULL) return -1;
    PyObject *v[3] = {o, KEY_, num};
    PyObject *r = PyObject_VectorcallMethod(s_set, v, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(num);
    if (r == NULL) return -1;
    Py_DECREF(r);
    put((intptr_t)n_);
    return 0;
}

static PyObject *on_op(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (TensorType_ == NULL) { PyErr_SetString(PyExc_RuntimeError, "_ctrace.setup() first"); return NULL; }
    if (argc != 3 || !PyTuple_Check(argv[1])) { PyErr_SetString(PyExc_TypeError, "on_op(name, args, out)"); return NULL; }
    PyObject *src = argv[1], *out = argv[2];
    if (PyTuple_GET_SIZE(src) == 3 && PyUnicode_Check(PyTuple_GET_ITEM(src, 1))
            && PyTuple_Check(PyTuple_GET_ITEM(src, 2)))
        src = PyTuple_GET_ITEM(src, 2);  /* legacy primitive: (prim, name, inputs) */
    put((intptr_t)argv[0]);  /* the name (interned by MindSpore) */
    Py_ssize_t n = PyTuple_GET_SIZE(src);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(src, i);
        if (!PyObject_TypeCheck(a, TensorType_)) continue;
        PyObject *v[2] = {a, KEY_};
        PyObject *t = PyObject_VectorcallMethod(s_get, v, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (t == NULL) return NULL;
        long long k = PyLong_Check(t) ? PyLong_AsLongLong(t) : -1;
        Py_DECREF(t);
        if (k == -1 && PyErr_Occurred()) return NULL;
        put((intptr_t)k);
    }
    if (PyObject_TypeCheck(out, TensorType_)) {
        if (tag_result(out) < 0) return NULL;
    } else if (PyTuple_Check(out) || PyList_Check(out)) {
        Py_ssize_t m = PySequence_Fast_GET_SIZE(out);
        for (Py_ssize_t i = 0; i < m; i++) {
            PyObject *o = PySequence_Fast_GET_ITEM(out, i);
            if (PyObject_TypeCheck(o, TensorType_) && tag_result(o) < 0) return NULL;
        }
    }
    calls_++;
    for (int i = 0; i < keep_n; i++) {  /* set_keep's experiment */
        PyObject *a = PyLong_FromLongLong(n_ + 1000 + i), *b = PyLong_FromLongLong(n_ + 5000 + i);
        PyObject *t = (a && b) ? PyTuple_Pack(4, a, b, argv[0], Py_None) : NULL;
        Py_XDECREF(a); Py_XDECREF(b);
        if (t == NULL) return NULL;
        if (keep_mode && PyList_Append(KEEP_, t) < 0) { Py_DECREF(t); return NULL; }
        Py_DECREF(t);
    }
    if (keep_mode && PyList_GET_SIZE(KEEP_) > 8192 && PyList_SetSlice(KEEP_, 0, PY_SSIZE_T_MAX, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}
static PyObject *set_keep(PyObject *self, PyObject *args) {
    if (!PyArg_ParseTuple(args, "ii", &keep_n, &keep_mode)) return NULL;
    if (KEEP_ == NULL) KEEP_ = PyList_New(0);
    Py_RETURN_NONE;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *ty, *key;
    if (!PyArg_ParseTuple(args, "O!U", &PyType_Type, &ty, &key)) return NULL;
    Py_XSETREF(TensorType_, (PyTypeObject *)Py_NewRef(ty));
    Py_XSETREF(KEY_, Py_NewRef(key));
    Py_RETURN_NONE;
}

static PyObject *calls(PyObject *self, PyObject *unused) { return PyLong_FromLongLong(calls_); }

static PyMethodDef methods[] = {
    {"on_op", (PyCFunction)(void (*)(void))on_op, METH_FASTCALL, NULL},
    {"setup", setup, METH_VARARGS, NULL},
    {"calls", calls, METH_NOARGS, NULL},
    {"set_keep", set_keep, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_ctrace", NULL, -1, methods};

PyMODINIT_FUNC PyInit__ctrace(void) {
    s_get = PyUnicode_InternFromString("_get_user_data");
    s_set = PyUnicode_InternFromString("_set_user_data");
    if (s_get == NULL || s_set == NULL) return NULL;
    return PyModule_Create(&moddef);
}
