/* The least an exact recorder can do per op in MindSpore 2.10, in C (profiling only:
   bench_record_overhead.py's `hooks+ctrace` configuration): read the identity tag (user data) of
   each tensor argument, append (name, tags and other arguments, the result's tag) to a list kept
   for the block, tag the result (epoch, n). No normalisation, no types, no plan lookup.

   setup(tensor_type, key, trace_list); on_op(name, args, out) -> None */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *TensorType_, *KEY_, *TRACE_, *s_get, *s_set, *ZERO_;
static long long n_;

static PyObject *on_op(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 3 || !PyTuple_Check(argv[1])) { PyErr_SetString(PyExc_TypeError, "on_op(name, args, out)"); return NULL; }
    PyObject *args = argv[1], *out = argv[2];
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *tags = PyTuple_New(n);
    if (tags == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(args, i), *t;
        int is_t = PyObject_IsInstance(a, TensorType_);
        if (is_t < 0) { Py_DECREF(tags); return NULL; }
        if (is_t) {
            PyObject *v[2] = {a, KEY_};
            t = PyObject_VectorcallMethod(s_get, v, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (t == NULL) { Py_DECREF(tags); return NULL; }
        } else {
            t = Py_NewRef(a);
        }
        PyTuple_SET_ITEM(tags, i, t);
    }
    PyObject *num = PyLong_FromLongLong(++n_);
    PyObject *otag = num ? PyTuple_Pack(2, ZERO_, num) : NULL;
    Py_XDECREF(num);
    if (otag == NULL) { Py_DECREF(tags); return NULL; }
    if (PyObject_TypeCheck(out, (PyTypeObject *)TensorType_)) {
        PyObject *v[3] = {out, KEY_, otag};
        PyObject *r = PyObject_VectorcallMethod(s_set, v, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (r == NULL) { Py_DECREF(tags); Py_DECREF(otag); return NULL; }
        Py_DECREF(r);
    }
    PyObject *ev = PyTuple_Pack(3, argv[0], tags, otag);
    Py_DECREF(tags); Py_DECREF(otag);
    if (ev == NULL || PyList_Append(TRACE_, ev) < 0) { Py_XDECREF(ev); return NULL; }
    Py_DECREF(ev);
    if (PyList_GET_SIZE(TRACE_) >= 4096 && PyList_SetSlice(TRACE_, 0, PY_SSIZE_T_MAX, NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    if (!PyArg_ParseTuple(args, "OOO!", &TensorType_, &KEY_, &PyList_Type, &TRACE_)) return NULL;
    Py_INCREF(TensorType_); Py_INCREF(KEY_); Py_INCREF(TRACE_);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"on_op", (PyCFunction)(void (*)(void))on_op, METH_FASTCALL, NULL},
    {"setup", setup, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL}};
static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_ctrace", NULL, -1, methods};

PyMODINIT_FUNC PyInit__ctrace(void) {
    s_get = PyUnicode_InternFromString("_get_user_data");
    s_set = PyUnicode_InternFromString("_set_user_data");
    ZERO_ = PyLong_FromLong(0);
    return PyModule_Create(&moddef);
}
