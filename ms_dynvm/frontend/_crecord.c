/* The recorder's hot path in C: `Recorder.on_op` for an op that finds its plan (see recorder.py).

   hit(rec, name, args, out) -> bool, rec the Recorder. True: the op was recorded exactly
   as `Recorder.on_op`'s plan-cache branch records it (one instruction whose one result is `out`,
   no recording scope; a tensor argument that holds no register of the current program yet becomes
   an input as `_make_inputs` makes it, unless it might be linked to a view, which Python does; a
   view result is typed and registered as a view candidate as on_op does); False: nothing was
   changed, and the caller runs `Recorder.on_op`, which handles every case. Built at run time by `frontend/fastpath.py` (gcc, cached on disk like kernels); without it
   the Python path runs alone.

   What it reads and writes in the Recorder's __dict__ (its attributes): _plans, epoch, _types, block,
   program, recording, _views_on, _view_keys, _link_all, _link_ops, want_tags, _one_instr, _names, _last_index; it sets last_op and last_tags and
   calls close_block("limit") as on_op does. Of the block (slots): _instrs, _pending, _pattrs; of
   the program: _n. An error raised half-way (a failing MindSpore call) propagates as on_op's
   would: the dispatcher counts it and the recorder starts a new block. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *TensorType_;   /* mindspore.Tensor */
static PyObject *ParamTypes_;   /* recorder._PTYPES: the Parameter classes met (keyed as tensors) */
static PyObject *TYPES_;        /* recorder._TYPES: (id(dtype), shape, contiguous) -> TensorType */
static PyObject *PKEY_;         /* "ms_dynvm.param" */
static PyObject *TENSOR_INPUTS_, *PARAM_INPUTS_, *TENSOR_INPUT_FN_, *PARAM_INPUT_FN_;
static Py_ssize_t n_fresh_hits;  /* ops recorded here that made inputs (stats()) */
static PyObject *KEY_;          /* "ms_dynvm" */
static PyObject *LEGACY_;       /* recorder._LEGACY */
static PyObject *MULTI_;        /* recorder._MULTI */
static PyObject *IS_CONTIG_;    /* TensorPy.is_contiguous */
static PyObject *s_get, *s_set, *s_plans, *s_epoch, *s_types, *s_block, *s_program, *s_recording,
                *s_want_tags, *s_one_instr, *s_names, *s_last_index, *s_last_op, *s_last_tags,
                *s_instrs, *s_pending, *s_pattrs, *s_n, *s_close_block, *s_limit, *s_add_view, *s_open_block, *s_views_on, *s_view_keys, *s_dtype, *s_shape, *s_mdtype, *s_mshape,
                *s_inputs, *s_link_all, *s_link_ops, *ONE;

#define MAXARGS 16

static PyObject *get_tag(PyObject *t) {
    PyObject *a[2] = {t, KEY_};
    return PyObject_VectorcallMethod(s_get, a, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* A tensor argument without a register of this program: made an input once the plan is found. */
typedef struct {
    Py_ssize_t k;    /* its index among the tensor arguments (pregs) */
    PyObject *t;     /* borrowed (args holds it) */
    PyObject *ty;    /* its TensorType (owned) */
    PyObject *old;   /* its tag, None or of an earlier program (owned) */
} Fresh;

/* tensor_type(t) where `_TYPES` has it (owned), NULL with no error where it has not (Python makes
   it), NULL with an error on failure. */
static PyObject *known_type(PyObject *t) {
    PyObject *dt = PyObject_GetAttr(t, s_mdtype);
    PyObject *shape = dt ? PyObject_GetAttr(t, s_mshape) : NULL;
    PyObject *c = shape ? PyObject_CallOneArg(IS_CONTIG_, t) : NULL;
    PyObject *idv = c ? PyLong_FromVoidPtr(dt) : NULL;
    PyObject *key = idv ? PyTuple_Pack(3, idv, shape, c) : NULL;
    PyObject *ty = NULL;
    if (key != NULL) {
        ty = PyDict_GetItemWithError(TYPES_, key);  /* borrowed */
        Py_XINCREF(ty);
    }
    Py_XDECREF(key); Py_XDECREF(idv); Py_XDECREF(c); Py_XDECREF(shape); Py_XDECREF(dt);
    return ty;
}

/* Append the key parts of one argument; 0 ok, 1 no key (the Python path decides), -1 error. */
static int key_part(PyObject *a, PyObject *epoch, PyObject *types, PyObject *parts,
                    PyObject **pregs, Py_ssize_t *np, Fresh *fresh, Py_ssize_t *nf) {
    PyTypeObject *ta = Py_TYPE(a);
    int is_param = 0;
    if ((PyObject *)ta != TensorType_ && ParamTypes_ != NULL && PySet_GET_SIZE(ParamTypes_)) {
        is_param = PySet_Contains(ParamTypes_, (PyObject *)ta);
        if (is_param < 0) return -1;
    }
    if ((PyObject *)ta == TensorType_ || is_param) {
        PyObject *tag = get_tag(a);
        if (tag == NULL) return -1;
        int same = 0;
        if (tag != Py_None) {
            if (!PyTuple_CheckExact(tag) || PyTuple_GET_SIZE(tag) != 2) { Py_DECREF(tag); return 1; }
            PyObject *e = PyTuple_GET_ITEM(tag, 0);
            same = e == epoch ? 1 : PyObject_RichCompareBool(e, epoch, Py_EQ);
            if (same < 0) { Py_DECREF(tag); return -1; }
        }
        if (*np >= MAXARGS) { Py_DECREF(tag); return 1; }
        if (!same) {  /* no register of this program: an input, made once the plan is found */
            PyObject *ty = known_type(a);
            if (ty == NULL) { Py_DECREF(tag); return PyErr_Occurred() ? -1 : 1; }
            PyObject *idv = PyLong_FromVoidPtr(ty);
            if (idv == NULL || PyList_Append(parts, idv) < 0) { Py_XDECREF(idv); Py_DECREF(ty); Py_DECREF(tag); return -1; }
            Py_DECREF(idv);
            fresh[*nf].k = *np; fresh[*nf].t = a; fresh[*nf].ty = ty; fresh[*nf].old = tag;  /* owns both */
            (*nf)++;
            pregs[(*np)++] = NULL;
            return 0;
        }
        PyObject *r = PyTuple_GET_ITEM(tag, 1);
        PyObject *ty = PyDict_GetItemWithError(types, r);  /* borrowed */
        if (ty == NULL) { Py_DECREF(tag); return PyErr_Occurred() ? -1 : 1; }
        PyObject *idv = PyLong_FromVoidPtr(ty);
        if (idv == NULL || PyList_Append(parts, idv) < 0) { Py_XDECREF(idv); Py_DECREF(tag); return -1; }
        Py_DECREF(idv);
        Py_INCREF(r);
        pregs[(*np)++] = r;
        Py_DECREF(tag);
        return 0;
    }
    if (ta == &PyFloat_Type) {
        double v = PyFloat_AS_DOUBLE(a);
        if (v == 0.0 || v != v) return 1;  /* -0.0 == 0.0, nan != nan: no key */
        if (PyList_Append(parts, (PyObject *)&PyFloat_Type) < 0 || PyList_Append(parts, a) < 0) return -1;
        return 0;
    }
    if (ta == &PyLong_Type || ta == &PyBool_Type || ta == &PyUnicode_Type) {
        if (PyList_Append(parts, (PyObject *)ta) < 0 || PyList_Append(parts, a) < 0) return -1;
        return 0;
    }
    if (a == Py_None) return PyList_Append(parts, Py_None) < 0 ? -1 : 0;
    if (ta == &PyTuple_Type || ta == &PyList_Type) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
        PyObject **items = PySequence_Fast_ITEMS(a);
        for (Py_ssize_t i = 0; i < n; i++)
            if (Py_TYPE(items[i]) != &PyLong_Type) return 1;
        PyObject *tup = ta == &PyTuple_Type ? (Py_INCREF(a), a) : PyList_AsTuple(a);
        if (tup == NULL) return -1;
        int rc = (PyList_Append(parts, (PyObject *)ta) < 0 || PyList_Append(parts, tup) < 0) ? -1 : 0;
        Py_DECREF(tup);
        return rc;
    }
    return 1;
}

/* Recorder._make_inputs for a plan hit, where no argument may be linked to a view (otherwise 1,
   before anything changed: Python links it). Every fresh argument becomes an input of the program
   in argument order (the plan has no `order`), as `_input_tag` makes it in plain mode; the same
   C++ tensor twice is made once (its tag read again). 0 done, 1 not here, -1 error (possibly
   half-way: the caller counts it as a recorder error, as on_op's). */
static int make_inputs(PyObject *d, PyObject *prog, PyObject *op, PyObject *epoch, PyObject *types,
                       Fresh *fresh, Py_ssize_t nf, PyObject **pregs) {
    PyObject *pnames[MAXARGS] = {NULL};
    int rc = 1;
    /* Recorder._link_for(op): op in _link_ops or _link_all */
    PyObject *lall = PyDict_GetItemWithError(d, s_link_all);
    PyObject *lops = lall ? PyDict_GetItemWithError(d, s_link_ops) : NULL;
    if (lops == NULL) return PyErr_Occurred() ? -1 : 1;
    if (!PyAnySet_Check(lops)) return 1;
    int views = PyObject_IsTrue(lall);
    if (views == 0) views = PySet_Contains(lops, op);
    if (views < 0) return -1;
    PyObject *vkeys = NULL;
    if (views) {
        vkeys = PyDict_GetItemWithError(d, s_view_keys);
        if (vkeys == NULL) return PyErr_Occurred() ? -1 : 1;
        if (!PyDict_CheckExact(vkeys)) return 1;
    }
    for (Py_ssize_t i = 0; i < nf; i++) {  /* checks first: nothing changes before a return of 1 */
        if (vkeys != NULL && PyDict_GET_SIZE(vkeys) && fresh[i].old == Py_None) {
            PyObject *dt = PyObject_GetAttr(fresh[i].ty, s_dtype);
            PyObject *sh = dt ? PyObject_GetAttr(fresh[i].ty, s_shape) : NULL;
            PyObject *k = sh ? PyTuple_Pack(2, dt, sh) : NULL;
            int in = k ? PyDict_Contains(vkeys, k) : -1;
            Py_XDECREF(k); Py_XDECREF(sh); Py_XDECREF(dt);
            if (in != 0) { rc = in < 0 ? -1 : 1; goto out; }  /* a view may be linked: Python */
        }
        PyObject *a[2] = {fresh[i].t, PKEY_};
        pnames[i] = PyObject_VectorcallMethod(s_get, a, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (pnames[i] == NULL) { rc = -1; goto out; }
        if (pnames[i] == Py_None && (PyObject *)Py_TYPE(fresh[i].t) != TensorType_) goto out;  /* an untagged Parameter */
    }
    PyObject *inputs = PyObject_GetAttr(prog, s_inputs);
    if (inputs == NULL) { rc = -1; goto out; }
    if (!PyList_CheckExact(inputs)) { Py_DECREF(inputs); goto out; }
    rc = -1;
    int again = 0;
    for (Py_ssize_t i = 0; i < nf; i++) {
        if (again) {  /* the same C++ tensor may come twice */
            PyObject *tag = get_tag(fresh[i].t);
            if (tag == NULL) goto out_inputs;
            if (PyTuple_CheckExact(tag) && PyTuple_GET_SIZE(tag) == 2) {
                int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(tag, 0), epoch, Py_EQ);
                if (same < 0) { Py_DECREF(tag); goto out_inputs; }
                if (same) {
                    pregs[fresh[i].k] = Py_NewRef(PyTuple_GET_ITEM(tag, 1));
                    Py_DECREF(tag);
                    continue;
                }
            }
            Py_DECREF(tag);
        }
        PyObject *rn = PyObject_GetAttr(prog, s_n);
        if (rn == NULL) goto out_inputs;
        pregs[fresh[i].k] = rn;  /* owned by pregs from here */
        PyObject *n1 = PyNumber_Add(rn, ONE);
        if (n1 == NULL) goto out_inputs;
        int bad = PyObject_SetAttr(prog, s_n, n1) < 0 || PyDict_SetItem(types, rn, fresh[i].ty) < 0;
        Py_DECREF(n1);
        if (bad) goto out_inputs;
        PyObject *inp;  /* owned */
        if (pnames[i] == Py_None) {  /* _TENSOR_INPUTS[r], or _tensor_input(r) */
            Py_ssize_t r = PyLong_AsSsize_t(rn);
            if (r == -1 && PyErr_Occurred()) goto out_inputs;
            inp = r >= 0 && r < PyList_GET_SIZE(TENSOR_INPUTS_) ? Py_NewRef(PyList_GET_ITEM(TENSOR_INPUTS_, r))
                                                                : PyObject_CallOneArg(TENSOR_INPUT_FN_, rn);
        } else {  /* _PARAM_INPUTS.get((r, name)), or _param_input(r, name) */
            PyObject *k = PyTuple_Pack(2, rn, pnames[i]);
            if (k == NULL) goto out_inputs;
            inp = PyDict_GetItemWithError(PARAM_INPUTS_, k);
            Py_XINCREF(inp);
            Py_DECREF(k);
            if (inp == NULL) {
                if (PyErr_Occurred()) goto out_inputs;
                PyObject *a[2] = {rn, pnames[i]};
                inp = PyObject_Vectorcall(PARAM_INPUT_FN_, a, 2, NULL);
            }
        }
        if (inp == NULL) goto out_inputs;
        bad = PyList_Append(inputs, inp) < 0;
        Py_DECREF(inp);
        if (bad) goto out_inputs;
        PyObject *tag = PyTuple_Pack(2, epoch, rn);
        if (tag == NULL) goto out_inputs;
        PyObject *a[3] = {fresh[i].t, KEY_, tag};
        PyObject *sv = PyObject_VectorcallMethod(s_set, a, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(tag);
        if (sv == NULL) goto out_inputs;
        Py_DECREF(sv);
        again = 1;
    }
    rc = 0;
    n_fresh_hits++;
out_inputs:
    Py_DECREF(inputs);
out:
    for (Py_ssize_t i = 0; i < nf; i++) Py_XDECREF(pnames[i]);
    return rc;
}

static PyObject *hit_in(PyObject *rec, PyObject *d, PyObject *name, PyObject *args, PyObject *out) {
    if (!PyDict_CheckExact(d) || !PyTuple_CheckExact(args)) Py_RETURN_FALSE;
    if (TensorType_ == NULL || (PyObject *)Py_TYPE(out) != TensorType_) Py_RETURN_FALSE;
    PyObject *plans_all = PyDict_GetItemWithError(d, s_plans);
    if (plans_all == NULL || !PyDict_CheckExact(plans_all)) goto miss_or_err;
    PyObject *plans = PyDict_GetItemWithError(plans_all, name);
    if (plans == NULL || !PyDict_CheckExact(plans)) goto miss_or_err;
    PyObject *recording = PyDict_GetItemWithError(d, s_recording);
    if (recording == NULL || recording != Py_None) goto miss_or_err;
    PyObject *epoch = PyDict_GetItemWithError(d, s_epoch);
    PyObject *types = PyDict_GetItemWithError(d, s_types);
    if (epoch == NULL || types == NULL || !PyDict_CheckExact(types)) goto miss_or_err;

    PyObject *src = args;
    PyObject *parts = PyList_New(0);
    if (parts == NULL) return NULL;
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    if (nargs == 3 && PyUnicode_CheckExact(PyTuple_GET_ITEM(args, 1))
            && PyTuple_CheckExact(PyTuple_GET_ITEM(args, 2))) {
        int eq = PyUnicode_Compare(PyTuple_GET_ITEM(args, 1), name);
        if (eq == -1 && PyErr_Occurred()) { Py_DECREF(parts); return NULL; }
        if (eq == 0) {
            src = PyTuple_GET_ITEM(args, 2);  /* legacy primitive: (prim, name, inputs) */
            if (PyList_Append(parts, LEGACY_) < 0) { Py_DECREF(parts); return NULL; }
        }
    }
    PyObject *pregs[MAXARGS];  /* owned; NULL for a fresh argument until its input is made */
    Fresh fresh[MAXARGS];
    Py_ssize_t np = 0, nf = 0, n = PyTuple_GET_SIZE(src);
    PyObject *result = NULL;
    PyObject *plan = NULL;  /* owned while in use: the calls below run Python code */
    for (Py_ssize_t i = 0; i < n; i++) {
        int rc = key_part(PyTuple_GET_ITEM(src, i), epoch, types, parts, pregs, &np, fresh, &nf);
        if (rc < 0) goto done;
        if (rc > 0) { result = Py_False; Py_INCREF(result); goto done; }
    }
    {
        PyObject *key = PyList_AsTuple(parts);
        if (key == NULL) goto done;
        plan = PyDict_GetItemWithError(plans, key);
        Py_DECREF(key);
        if (plan == NULL) {
            if (PyErr_Occurred()) goto done;
            result = Py_False; Py_INCREF(result); goto done;
        }
        Py_INCREF(plan);
        if (!PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 8 || PyTuple_GET_ITEM(plan, 0) == MULTI_) {
            result = Py_False; Py_INCREF(result); goto done;  /* several instructions: Python */
        }
        PyObject *op = PyTuple_GET_ITEM(plan, 0), *fill = PyTuple_GET_ITEM(plan, 1);
        PyObject *mask = PyTuple_GET_ITEM(plan, 2), *attrs = PyTuple_GET_ITEM(plan, 3);
        PyObject *rty = PyTuple_GET_ITEM(plan, 4);
        int is_view = PyObject_IsTrue(PyTuple_GET_ITEM(plan, 5));
        if (is_view < 0) goto done;
        if (PyTuple_GET_ITEM(plan, 6) != Py_None) {
            /* `order`: on_op reads last_tags back off the tensors then (_read_tags): Python */
            result = Py_False; Py_INCREF(result); goto done;
        }
        if (nf) {  /* the fresh arguments become inputs (Recorder._make_inputs) */
            PyObject *prog0 = PyDict_GetItemWithError(d, s_program);
            if (prog0 == NULL) { if (!PyErr_Occurred()) { result = Py_False; Py_INCREF(result); } goto done; }
            int rc = make_inputs(d, prog0, op, epoch, types, fresh, nf, pregs);
            if (rc < 0) goto done;
            if (rc > 0) { result = Py_False; Py_INCREF(result); goto done; }
        }

        PyObject *block = PyDict_GetItemWithError(d, s_block);  /* borrowed */
        if (block == NULL && PyErr_Occurred()) goto done;
        if (block == NULL || block == Py_None) {  /* the op will be recorded: open the block */
            PyObject *a[1] = {rec};
            PyObject *b = PyObject_VectorcallMethod(s_open_block, a, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (b == NULL) goto done;
            Py_DECREF(b);  /* the recorder holds it (self.block) */
            block = PyDict_GetItemWithError(d, s_block);
            if (block == NULL || block == Py_None) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "_open_block opened no block");
                goto done;
            }
        }
        PyObject *prog = PyDict_GetItemWithError(d, s_program);
        if (prog == NULL) { if (!PyErr_Occurred()) { result = Py_False; Py_INCREF(result); } goto done; }
        PyObject *pending = PyObject_GetAttr(block, s_pending);
        PyObject *instrs = pending ? PyObject_GetAttr(block, s_instrs) : NULL;
        PyObject *pattrs = instrs ? PyObject_GetAttr(block, s_pattrs) : NULL;
        PyObject *rn = pattrs ? PyObject_GetAttr(prog, s_n) : NULL;
        PyObject *regs = NULL, *outs = NULL, *raw = NULL, *otag = NULL, *last = NULL, *sv = NULL;
        PyObject *n1 = NULL, *st = NULL, *st1 = NULL, *ty = NULL, *operands = NULL;
        if (rn == NULL) goto fail;
        if (!PyList_CheckExact(pending) || !PyList_CheckExact(instrs) || !PyList_CheckExact(pattrs)
                || !PyLong_CheckExact(rn)) {
            result = Py_False; Py_INCREF(result); goto cleanup;  /* nothing changed yet */
        }
        Py_ssize_t start = PyList_GET_SIZE(instrs) + PyList_GET_SIZE(pending);
        if (is_view) {  /* ty = rty[_is_contiguous(out)] */
            PyObject *c = PyObject_CallOneArg(IS_CONTIG_, out);
            if (c == NULL) goto fail;
            ty = PyObject_GetItem(rty, c);
            Py_DECREF(c);
            if (ty == NULL) goto fail;
        } else {
            ty = Py_NewRef(rty);
        }
        n1 = PyNumber_Add(rn, ONE);
        if (n1 == NULL || PyDict_SetItem(types, rn, ty) < 0 || PyObject_SetAttr(prog, s_n, n1) < 0) goto fail;
        if (fill == Py_None) {
            regs = PyTuple_New(np);
            if (regs == NULL) goto fail;
            for (Py_ssize_t i = 0; i < np; i++) { Py_INCREF(pregs[i]); PyTuple_SET_ITEM(regs, i, pregs[i]); }
            operands = Py_NewRef(regs);
        } else {  /* fill(pregs): the operands with the plan's immediates in place */
            regs = PyList_New(np);
            if (regs == NULL) goto fail;
            for (Py_ssize_t i = 0; i < np; i++) { Py_INCREF(pregs[i]); PyList_SET_ITEM(regs, i, pregs[i]); }
            operands = PyObject_CallOneArg(fill, regs);
            if (operands == NULL) goto fail;
        }
        outs = PyTuple_Pack(1, rn);
        raw = outs ? PyTuple_Pack(4, op, operands, outs, mask) : NULL;
        if (raw == NULL || PyList_Append(pending, raw) < 0 || PyList_Append(pattrs, attrs) < 0) goto fail;
        otag = PyTuple_Pack(2, epoch, rn);
        if (otag == NULL) goto fail;
        {
            PyObject *a[3] = {out, KEY_, otag};
            sv = PyObject_VectorcallMethod(s_set, a, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (sv == NULL) goto fail;
        }
        PyObject *von = is_view ? PyDict_GetItemWithError(d, s_views_on) : NULL;
        int track = von ? PyObject_IsTrue(von) : 0;
        if (track < 0 || (is_view && von == NULL && PyErr_Occurred())) goto fail;
        if (track) {  /* self._add_view(out, r, ty, True), where view results are kept (_views_on) */
            PyObject *a[5] = {rec, out, rn, ty, Py_True};
            PyObject *v = PyObject_VectorcallMethod(s_add_view, a, 5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (v == NULL) goto fail;
            Py_DECREF(v);
        }
        st = PyLong_FromSsize_t(start);
        st1 = PyLong_FromSsize_t(start + 1);
        last = (st && st1) ? PyTuple_Pack(4, block, st, st1, outs) : NULL;
        if (last == NULL || PyDict_SetItem(d, s_last_op, last) < 0) goto fail;
        {
            PyObject *want = PyDict_GetItemWithError(d, s_want_tags);
            int w = want ? PyObject_IsTrue(want) : (PyErr_Occurred() ? -1 : 0);
            if (w < 0) goto fail;
            if (w) {
                PyObject *at = PyList_New(np), *ot = PyList_New(1), *tags = NULL;
                if (at == NULL || ot == NULL) { Py_XDECREF(at); Py_XDECREF(ot); goto fail; }
                for (Py_ssize_t i = 0; i < np; i++) {
                    PyObject *t = PyTuple_Pack(2, epoch, pregs[i]);
                    if (t == NULL) { Py_DECREF(at); Py_DECREF(ot); goto fail; }
                    PyList_SET_ITEM(at, i, t);
                }
                Py_INCREF(otag);
                PyList_SET_ITEM(ot, 0, otag);
                tags = PyTuple_Pack(2, at, ot);
                Py_DECREF(at); Py_DECREF(ot);
                if (tags == NULL || PyDict_SetItem(d, s_last_tags, tags) < 0) { Py_XDECREF(tags); goto fail; }
                Py_DECREF(tags);
            } else if (PyDict_SetItem(d, s_last_tags, Py_None) < 0) goto fail;
        }
        {
            PyObject *one = PyDict_GetItemWithError(d, s_one_instr);
            PyObject *names = PyDict_GetItemWithError(d, s_names);
            if (one == NULL || names == NULL) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "recorder counters");
                goto fail;
            }
            if (PyList_Append(one, Py_None) < 0 || PyList_Append(names, name) < 0) goto fail;
            PyObject *li = PyDict_GetItemWithError(d, s_last_index);
            if (li == NULL) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "_last_index");
                goto fail;
            }
            Py_ssize_t lim = PyLong_AsSsize_t(li);
            if (lim == -1 && PyErr_Occurred()) goto fail;
            if (start >= lim) {
                PyObject *r = PyObject_CallMethodOneArg(rec, s_close_block, s_limit);
                if (r == NULL) goto fail;
                Py_DECREF(r);
            }
        }
        result = Py_True; Py_INCREF(result);
        goto cleanup;
    fail:
        /* An error (always with an exception set): the dispatcher counts it as a recorder error,
           the op's result is still returned, and the recorder starts a new block. */
        result = NULL;
    cleanup:
        Py_XDECREF(pending); Py_XDECREF(instrs); Py_XDECREF(pattrs); Py_XDECREF(rn); Py_XDECREF(regs);
        Py_XDECREF(outs); Py_XDECREF(raw); Py_XDECREF(otag); Py_XDECREF(last); Py_XDECREF(sv);
        Py_XDECREF(n1); Py_XDECREF(st); Py_XDECREF(st1); Py_XDECREF(ty); Py_XDECREF(operands);
    }
done:
    for (Py_ssize_t i = 0; i < np; i++) Py_XDECREF(pregs[i]);
    for (Py_ssize_t i = 0; i < nf; i++) { Py_DECREF(fresh[i].ty); Py_DECREF(fresh[i].old); }
    Py_XDECREF(plan);
    Py_DECREF(parts);
    return result;
miss_or_err:
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_FALSE;
}

static PyObject *hit(PyObject *self, PyObject *const *argv, Py_ssize_t argc) {
    if (argc != 4) { PyErr_SetString(PyExc_TypeError, "hit(rec, name, args, out)"); return NULL; }
    PyObject *d = PyObject_GenericGetDict(argv[0], NULL);
    if (d == NULL) return NULL;
    PyObject *r = hit_in(argv[0], d, argv[1], argv[2], argv[3]);
    Py_DECREF(d);
    return r;
}

static PyObject *setup(PyObject *self, PyObject *args) {
    PyObject *t, *k, *l, *m, *c, *p, *ty, *pk, *ti, *pi, *tf, *pf;
    if (!PyArg_ParseTuple(args, "OUOOOOO!UO!O!OO", &t, &k, &l, &m, &c, &p, &PyDict_Type, &ty, &pk,
                          &PyList_Type, &ti, &PyDict_Type, &pi, &tf, &pf)) return NULL;
    Py_XSETREF(TYPES_, Py_NewRef(ty)); Py_XSETREF(PKEY_, Py_NewRef(pk));
    Py_XSETREF(TENSOR_INPUTS_, Py_NewRef(ti)); Py_XSETREF(PARAM_INPUTS_, Py_NewRef(pi));
    Py_XSETREF(TENSOR_INPUT_FN_, Py_NewRef(tf)); Py_XSETREF(PARAM_INPUT_FN_, Py_NewRef(pf));
    if (!PySet_Check(p)) { PyErr_SetString(PyExc_TypeError, "setup: a set of Parameter classes"); return NULL; }
    Py_XSETREF(ParamTypes_, Py_NewRef(p));
    Py_XSETREF(IS_CONTIG_, Py_NewRef(c));
    Py_XSETREF(TensorType_, Py_NewRef(t));
    Py_XSETREF(KEY_, Py_NewRef(k));
    Py_XSETREF(LEGACY_, Py_NewRef(l));
    Py_XSETREF(MULTI_, Py_NewRef(m));
    Py_RETURN_NONE;
}

static PyObject *stats(PyObject *self, PyObject *unused) {
    return Py_BuildValue("{sn}", "fresh_hits", n_fresh_hits);
}

static PyMethodDef methods[] = {
    {"hit", (PyCFunction)(void (*)(void))hit, METH_FASTCALL, "the plan-cache branch of Recorder.on_op"},
    {"setup", setup, METH_VARARGS, "setup(Tensor, key, legacy, multi, is_contiguous, parameter classes, _TYPES, param key, _TENSOR_INPUTS, _PARAM_INPUTS, _tensor_input, _param_input)"},
    {"stats", stats, METH_NOARGS, "{'fresh_hits': ops recorded here that made inputs}"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_crecord", NULL, -1, methods};

PyMODINIT_FUNC PyInit__crecord(void) {
#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL
    INTERN(s_get, "_get_user_data"); INTERN(s_set, "_set_user_data"); INTERN(s_plans, "_plans");
    INTERN(s_epoch, "epoch"); INTERN(s_types, "_types"); INTERN(s_block, "block");
    INTERN(s_program, "program"); INTERN(s_recording, "recording"); INTERN(s_want_tags, "want_tags");
    INTERN(s_one_instr, "_one_instr"); INTERN(s_names, "_names"); INTERN(s_last_index, "_last_index");
    INTERN(s_last_op, "last_op"); INTERN(s_last_tags, "last_tags"); INTERN(s_instrs, "_instrs");
    INTERN(s_pending, "_pending"); INTERN(s_pattrs, "_pattrs"); INTERN(s_n, "_n");
    INTERN(s_close_block, "close_block"); INTERN(s_limit, "limit"); INTERN(s_add_view, "_add_view"); INTERN(s_open_block, "_open_block");
    INTERN(s_views_on, "_views_on"); INTERN(s_view_keys, "_view_keys"); INTERN(s_dtype, "dtype");
    INTERN(s_shape, "shape"); INTERN(s_mdtype, "_dtype"); INTERN(s_mshape, "_shape"); INTERN(s_inputs, "inputs");
    INTERN(s_link_all, "_link_all"); INTERN(s_link_ops, "_link_ops");
    if ((ONE = PyLong_FromLong(1)) == NULL) return NULL;
#undef INTERN
    return PyModule_Create(&moddef);
}
