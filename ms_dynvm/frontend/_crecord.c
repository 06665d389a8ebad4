/* The recorder's hot path in C: `Recorder.on_op` for an op that finds its plan (see recorder.py).

   hit(rec, name, args, out) -> bool, rec the Recorder. True: the op was recorded exactly
   as `Recorder.on_op`'s plan-cache branch records it (one instruction whose one result is `out`,
   or a cached lowering of several instructions or results as `_run_multi` records it; no recording
   scope; a tensor argument that holds no register of the current program yet becomes
   an input as `_make_inputs` makes it, unless it might be linked to a view, which Python does; a
   view result is typed and registered as a view candidate as on_op does); False: nothing was
   changed, and the caller runs `Recorder.on_op`, which handles every case. Built at run time by `frontend/fastpath.py` (gcc, cached on disk like kernels); without it
   the Python path runs alone.

   What it reads and writes in the Recorder's __dict__ (its attributes): _plans, epoch, _types, _legacy_key, block,
   program, recording, _views_on, _view_keys, _link_all, _link_ops, want_tags, _one_instr, _names, _last_index; it sets last_op and last_tags and
   calls close_block("limit") as on_op does. Of the block (slots): _instrs, _pending, _pattrs; of
   the program: _n. An error raised half-way (a failing MindSpore call) propagates as on_op's
   would: the dispatcher counts it and the recorder starts a new block. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Built with -DDVM_STAGES (profiling/tools/breakdown_record.py only; the recorder never is): time-stamp
   counter cycles spent in each stage of `hit`, summed until stages() reads and resets them (the
   names: STAGE_NAMES). Otherwise STAGE() is nothing. x86-64 only. */
#ifdef DVM_STAGES
#include <x86intrin.h>
#define N_STAGES 12
static const char *STAGE_NAMES[N_STAGES] = {
    "", "recorder state", "argument tags, key", "plan lookup", "inputs made", "block",
    "register, type", "instruction", "result tag", "last_op, counters", "cleanup", "multi-instruction plan"};
static unsigned long long stage_cycles[N_STAGES], stage_t;
#define STAGE_START() (stage_t = __rdtsc())
#define STAGE(k) do { unsigned long long now_ = __rdtsc(); stage_cycles[k] += now_ - stage_t; stage_t = now_; } while (0)
#else
#define STAGE_START() ((void)0)
#define STAGE(k) ((void)0)
#endif

static PyObject *TensorType_;   /* mindspore.Tensor */
static PyObject *ParamTypes_;   /* recorder._PTYPES: the Parameter classes met (keyed as tensors) */
static PyObject *TYPES_;        /* recorder._TYPES: (id(dtype), shape, contiguous) -> TensorType */
static PyObject *PKEY_;         /* "ms_dynvm.param" */
static PyObject *TENSOR_INPUTS_, *PARAM_INPUTS_, *TENSOR_INPUT_FN_, *PARAM_INPUT_FN_;
static Py_ssize_t n_fresh_hits;  /* ops recorded here that made inputs (stats()) */
static Py_ssize_t n_multi_hits;  /* ops recorded here from a plan of several instructions (stats()) */
static PyObject *METRICS_;      /* ms_dynvm.metrics.METRICS */
static PyObject *KEY_;          /* "ms_dynvm" */
static PyObject *MULTI_;        /* recorder._MULTI */
static PyObject *IS_CONTIG_;    /* TensorPy.is_contiguous */
static PyObject *s_get, *s_set, *s_plans, *s_epoch, *s_types, *s_block, *s_program, *s_recording,
                *s_want_tags, *s_one_instr, *s_names, *s_last_index, *s_last_op, *s_last_tags,
                *s_instrs, *s_pending, *s_pattrs, *s_n, *s_close_block, *s_limit, *s_add_view, *s_open_block, *s_views_on, *s_view_keys, *s_dtype, *s_shape, *s_mdtype, *s_mshape,
                *s_inputs, *s_legacy_key, *s_link_all, *s_link_ops, *s_max_block_ops, *s_ops_recorded, *s_instrs_m, *ONE;

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

/* The plan key in C. Python keys a plan by a tuple: per argument, the id of its register's (interned)
   type, or its Python type and value (see Recorder.on_op). Built here as a run of machine words
   instead (no Python object made), which finds the plan in `ctab`, a 4-way set-associative cache of plan
   lookups that hit in Python before. An entry is valid only while the plans dict it was found in is
   unchanged: it holds the dict's `ma_version_tag` (CPython 3.11: a global counter, a new value at
   every change of any dict, so an equal tag is the same dict in the same state). A miss, or an
   argument the words cannot hold (a str, a big int, a long tuple), builds the Python key
   (`py_parts`) and asks the dict, as before. A new entry goes first in its set of 4 and pushes out
   the set's oldest (first in, first out): a block's keys evict each other only when 5 of them fall
   in one set of 256 (a direct-mapped table lost hits to any pair sharing a slot). */
#define CW 24                       /* words per key */
#define CT_WAYS 4
#define CT_SETS_BITS 8
#define CT_SETS (1 << CT_SETS_BITS)
#define CT_SIZE (CT_SETS * CT_WAYS)
#if PY_VERSION_HEX < 0x030C0000
#define HAVE_CTAB 1
#else
#define HAVE_CTAB 0                 /* (the version tag is deprecated from 3.12: Python keys only) */
#endif
typedef struct {
    PyObject *plans;                /* the per-name plans dict (not owned; checked with `ver`) */
    uint64_t ver;                   /* its ma_version_tag when the entry was made; 0: empty */
    Py_ssize_t nw;
    intptr_t w[CW];
    PyObject *plan;                 /* owned */
} CEnt;
static CEnt *ctab;
static Py_ssize_t n_ctab_hits, n_ctab_misses;

typedef struct { Py_ssize_t n; int ok; intptr_t w[CW]; } Words;

static void kw_put(Words *kw, intptr_t v) {
    if (kw->n < CW) kw->w[kw->n++] = v;
    else kw->ok = 0;
}

static void kw_long(Words *kw, PyObject *a) {
    int ovf = 0;
    long long v = PyLong_AsLongLongAndOverflow(a, &ovf);
    if (ovf || (v == -1 && PyErr_Occurred())) { PyErr_Clear(); kw->ok = 0; return; }
    kw_put(kw, (intptr_t)v);
}

static uint64_t kw_hash(PyObject *plans, const Words *kw) {
    uint64_t h = (uint64_t)(uintptr_t)plans * 0x9E3779B97F4A7C15ull;
    for (Py_ssize_t i = 0; i < kw->n; i++) {
        h ^= (uint64_t)kw->w[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    }
    h ^= h >> 33; h *= 0xFF51AFD7ED558CCDull; h ^= h >> 33;  /* (a full-width mix: the set index takes low bits) */
    return h;
}

#if HAVE_CTAB
static uint64_t dict_version(PyObject *d) { return ((PyDictObject *)d)->ma_version_tag; }
#endif

/* The cached plan for `kw` in `plans` (borrowed), or NULL. */
static PyObject *ctab_get(PyObject *plans, const Words *kw) {
#if HAVE_CTAB
    if (ctab == NULL || !kw->ok) return NULL;
    CEnt *set = &ctab[(kw_hash(plans, kw) & (CT_SETS - 1)) * CT_WAYS];
    uint64_t ver = dict_version(plans);
    for (int k = 0; k < CT_WAYS; k++) {
        CEnt *e = &set[k];
        if (e->plans == plans && e->ver != 0 && e->ver == ver && e->nw == kw->n
                && memcmp(e->w, kw->w, (size_t)kw->n * sizeof(intptr_t)) == 0) {
            n_ctab_hits++;
            return e->plan;
        }
    }
    n_ctab_misses++;
#endif
    return NULL;
}

static void ctab_put(PyObject *plans, const Words *kw, PyObject *plan) {
#if HAVE_CTAB
    if (ctab == NULL || !kw->ok) return;
    CEnt *set = &ctab[(kw_hash(plans, kw) & (CT_SETS - 1)) * CT_WAYS];
    PyObject *old = set[CT_WAYS - 1].plan;  /* the oldest leaves */
    memmove(&set[1], &set[0], (CT_WAYS - 1) * sizeof(CEnt));
    CEnt *e = &set[0];
    e->plan = Py_NewRef(plan);
    e->plans = plans;
    e->ver = dict_version(plans);
    e->nw = kw->n;
    memcpy(e->w, kw->w, (size_t)kw->n * sizeof(intptr_t));
    Py_XDECREF(old);  /* (last: its deallocation may run Python code) */
#endif
}

static void ctab_clear(void) {
    if (ctab == NULL) return;
    for (Py_ssize_t i = 0; i < CT_SIZE; i++) {
        PyObject *old = ctab[i].plan;
        ctab[i].plan = NULL;
        ctab[i].ver = 0;
        Py_XDECREF(old);
    }
}

enum { W_TENSOR = 1, W_FLOAT, W_INT, W_BOOL, W_NONE, W_TUPLE, W_LIST, W_LEGACY };

static int is_tensor_arg(PyObject *a) {  /* 1, 0, -1 error */
    PyTypeObject *ta = Py_TYPE(a);
    if ((PyObject *)ta == TensorType_) return 1;
    if (ParamTypes_ != NULL && PySet_GET_SIZE(ParamTypes_)) return PySet_Contains(ParamTypes_, (PyObject *)ta);
    return 0;
}

/* One argument's part of the key, in words; the tensor argument's register (pregs) or, where it has
   none in this program, a Fresh entry, and its type (tys, borrowed: the types dict or the Fresh entry
   holds it). 0 ok, 1 no key (the Python path decides), -1 error. */
static int key_part(PyObject *a, PyObject *epoch, PyObject *types, Words *kw, PyObject **pregs,
                    PyObject **tys, Py_ssize_t *np, Fresh *fresh, Py_ssize_t *nf) {
    PyTypeObject *ta = Py_TYPE(a);
    int is_t = is_tensor_arg(a);
    if (is_t < 0) return -1;
    if (is_t) {
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
            fresh[*nf].k = *np; fresh[*nf].t = a; fresh[*nf].ty = ty; fresh[*nf].old = tag;  /* owns both */
            (*nf)++;
            tys[*np] = ty;
            pregs[(*np)++] = NULL;
            kw_put(kw, W_TENSOR); kw_put(kw, (intptr_t)ty);
            return 0;
        }
        PyObject *r = PyTuple_GET_ITEM(tag, 1);
        PyObject *ty = PyDict_GetItemWithError(types, r);  /* borrowed */
        if (ty == NULL) { Py_DECREF(tag); return PyErr_Occurred() ? -1 : 1; }
        Py_INCREF(r);
        tys[*np] = ty;
        pregs[(*np)++] = r;
        Py_DECREF(tag);
        kw_put(kw, W_TENSOR); kw_put(kw, (intptr_t)ty);
        return 0;
    }
    if (ta == &PyFloat_Type) {
        double v = PyFloat_AS_DOUBLE(a);
        if (v == 0.0 || v != v) return 1;  /* -0.0 == 0.0, nan != nan: no key */
        intptr_t bits;
        memcpy(&bits, &v, sizeof bits);
        kw_put(kw, W_FLOAT); kw_put(kw, bits);
        return 0;
    }
    if (ta == &PyBool_Type) { kw_put(kw, W_BOOL); kw_put(kw, a == Py_True); return 0; }
    if (ta == &PyLong_Type) { kw_put(kw, W_INT); kw_long(kw, a); return 0; }
    if (ta == &PyUnicode_Type) { kw->ok = 0; return 0; }  /* keyed in Python only */
    if (a == Py_None) { kw_put(kw, W_NONE); return 0; }
    if (ta == &PyTuple_Type || ta == &PyList_Type) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
        PyObject **items = PySequence_Fast_ITEMS(a);
        for (Py_ssize_t i = 0; i < n; i++)
            if (Py_TYPE(items[i]) != &PyLong_Type) return 1;
        kw_put(kw, ta == &PyTuple_Type ? W_TUPLE : W_LIST);
        kw_put(kw, (intptr_t)n);
        for (Py_ssize_t i = 0; i < n && kw->ok; i++) kw_long(kw, items[i]);
        return 0;
    }
    return 1;
}

/* The Python key's parts of one argument (after key_part accepted every argument): per tensor
   argument the id of its type (tys, in order), else its Python type and value. 0 or -1. */
static int py_part(PyObject *a, PyObject *parts, PyObject **tys, Py_ssize_t *j) {
    PyTypeObject *ta = Py_TYPE(a);
    int is_t = is_tensor_arg(a);
    if (is_t < 0) return -1;
    if (is_t) {
        PyObject *idv = PyLong_FromVoidPtr(tys[(*j)++]);
        int rc = idv == NULL || PyList_Append(parts, idv) < 0 ? -1 : 0;
        Py_XDECREF(idv);
        return rc;
    }
    if (a == Py_None) return PyList_Append(parts, Py_None) < 0 ? -1 : 0;
    if (ta == &PyTuple_Type || ta == &PyList_Type) {
        PyObject *tup = ta == &PyTuple_Type ? (Py_INCREF(a), a) : PyList_AsTuple(a);
        if (tup == NULL) return -1;
        int rc = (PyList_Append(parts, (PyObject *)ta) < 0 || PyList_Append(parts, tup) < 0) ? -1 : 0;
        Py_DECREF(tup);
        return rc;
    }
    /* float, int, bool, str: (type, value) */
    return (PyList_Append(parts, (PyObject *)ta) < 0 || PyList_Append(parts, a) < 0) ? -1 : 0;
}

/* Checks before any input is made (nothing changes here): 0 go on (pnames[i] holds each fresh
   argument's Parameter name or None, owned), 1 not here (Python: an argument that may be linked to
   a view, an untagged Parameter), -1 error. `link`: view links apply to these arguments
   (Recorder._link_for; _run_multi checks the view candidates whatever the op). */
static int fresh_checks(PyObject *d, int link, Fresh *fresh, Py_ssize_t nf, PyObject **pnames) {
    PyObject *vkeys = NULL;
    if (link) {
        vkeys = PyDict_GetItemWithError(d, s_view_keys);
        if (vkeys == NULL) return PyErr_Occurred() ? -1 : 1;
        if (!PyDict_CheckExact(vkeys)) return 1;
    }
    for (Py_ssize_t i = 0; i < nf; i++) {
        if (vkeys != NULL && PyDict_GET_SIZE(vkeys) && fresh[i].old == Py_None) {
            PyObject *dt = PyObject_GetAttr(fresh[i].ty, s_dtype);
            PyObject *sh = dt ? PyObject_GetAttr(fresh[i].ty, s_shape) : NULL;
            PyObject *k = sh ? PyTuple_Pack(2, dt, sh) : NULL;
            int in = k ? PyDict_Contains(vkeys, k) : -1;
            Py_XDECREF(k); Py_XDECREF(sh); Py_XDECREF(dt);
            if (in != 0) return in < 0 ? -1 : 1;  /* a view may be linked: Python */
        }
        PyObject *a[2] = {fresh[i].t, PKEY_};
        pnames[i] = PyObject_VectorcallMethod(s_get, a, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (pnames[i] == NULL) return -1;
        if (pnames[i] == Py_None && (PyObject *)Py_TYPE(fresh[i].t) != TensorType_) return 1;  /* an untagged Parameter */
    }
    return 0;
}

/* Recorder._input_tag in plain mode for fresh argument `f` (Parameter name or None `pname`): a new
   register of the program, an input record, the tag; with `*again` (an input was made before in
   this op: the same C++ tensor may come twice) the tag is read again first. 0 or -1. */
static int make_input(PyObject *prog, PyObject *inputs, PyObject *epoch, PyObject *types, Fresh *f,
                      PyObject *pname, PyObject **pregs, int *again) {
    if (*again) {
        PyObject *tag = get_tag(f->t);
        if (tag == NULL) return -1;
        if (PyTuple_CheckExact(tag) && PyTuple_GET_SIZE(tag) == 2) {
            int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(tag, 0), epoch, Py_EQ);
            if (same < 0) { Py_DECREF(tag); return -1; }
            if (same) {
                pregs[f->k] = Py_NewRef(PyTuple_GET_ITEM(tag, 1));
                Py_DECREF(tag);
                return 0;
            }
        }
        Py_DECREF(tag);
    }
    PyObject *rn = PyObject_GetAttr(prog, s_n);
    if (rn == NULL) return -1;
    pregs[f->k] = rn;  /* owned by pregs from here */
    PyObject *n1 = PyNumber_Add(rn, ONE);
    if (n1 == NULL) return -1;
    int bad = PyObject_SetAttr(prog, s_n, n1) < 0 || PyDict_SetItem(types, rn, f->ty) < 0;
    Py_DECREF(n1);
    if (bad) return -1;
    PyObject *inp;  /* owned */
    if (pname == Py_None) {  /* _TENSOR_INPUTS[r], or _tensor_input(r) */
        Py_ssize_t r = PyLong_AsSsize_t(rn);
        if (r == -1 && PyErr_Occurred()) return -1;
        inp = r >= 0 && r < PyList_GET_SIZE(TENSOR_INPUTS_) ? Py_NewRef(PyList_GET_ITEM(TENSOR_INPUTS_, r))
                                                            : PyObject_CallOneArg(TENSOR_INPUT_FN_, rn);
    } else {  /* _PARAM_INPUTS.get((r, name)), or _param_input(r, name) */
        PyObject *k = PyTuple_Pack(2, rn, pname);
        if (k == NULL) return -1;
        inp = PyDict_GetItemWithError(PARAM_INPUTS_, k);
        Py_XINCREF(inp);
        Py_DECREF(k);
        if (inp == NULL) {
            if (PyErr_Occurred()) return -1;
            PyObject *a[2] = {rn, pname};
            inp = PyObject_Vectorcall(PARAM_INPUT_FN_, a, 2, NULL);
        }
    }
    if (inp == NULL) return -1;
    bad = PyList_Append(inputs, inp) < 0;
    Py_DECREF(inp);
    if (bad) return -1;
    PyObject *tag = PyTuple_Pack(2, epoch, rn);
    if (tag == NULL) return -1;
    PyObject *a[3] = {f->t, KEY_, tag};
    PyObject *sv = PyObject_VectorcallMethod(s_set, a, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    Py_DECREF(tag);
    if (sv == NULL) return -1;
    Py_DECREF(sv);
    *again = 1;
    return 0;
}

/* Recorder._link_for(op): op in _link_ops or _link_all; -1 error. */
static int link_for(PyObject *d, PyObject *op) {
    PyObject *lall = PyDict_GetItemWithError(d, s_link_all);
    PyObject *lops = lall ? PyDict_GetItemWithError(d, s_link_ops) : NULL;
    if (lops == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "_link_all/_link_ops");
        return -1;
    }
    int all = PyObject_IsTrue(lall);
    if (all != 0) return all;
    return PyAnySet_Check(lops) ? PySet_Contains(lops, op) : 1;
}

/* Recorder._make_inputs for a single-instruction plan hit (no `order`: argument order), where no
   argument may be linked to a view (otherwise 1, before anything changed: Python links it). 0 done,
   1 not here, -1 error (possibly half-way: the caller counts it as a recorder error, as on_op's). */
static int make_inputs(PyObject *d, PyObject *prog, PyObject *op, PyObject *epoch, PyObject *types,
                       Fresh *fresh, Py_ssize_t nf, PyObject **pregs) {
    PyObject *pnames[MAXARGS] = {NULL};
    int link = link_for(d, op);
    int rc = link < 0 ? -1 : fresh_checks(d, link, fresh, nf, pnames);
    if (rc == 0) {
        PyObject *inputs = PyObject_GetAttr(prog, s_inputs);
        if (inputs == NULL) rc = -1;
        else if (!PyList_CheckExact(inputs)) rc = 1;
        else {
            int again = 0;
            for (Py_ssize_t i = 0; i < nf && rc == 0; i++)
                rc = make_input(prog, inputs, epoch, types, &fresh[i], pnames[i], pregs, &again);
            if (rc == 0) n_fresh_hits++;
        }
        Py_XDECREF(inputs);
    }
    for (Py_ssize_t i = 0; i < nf; i++) Py_XDECREF(pnames[i]);
    return rc;
}

/* self.block, opened (Recorder._open_block) where none is: borrowed, or NULL with an error. */
static PyObject *open_block(PyObject *rec, PyObject *d) {
    PyObject *block = PyDict_GetItemWithError(d, s_block);  /* borrowed */
    if (block == NULL && PyErr_Occurred()) return NULL;
    if (block == NULL || block == Py_None) {
        PyObject *a[1] = {rec};
        PyObject *b = PyObject_VectorcallMethod(s_open_block, a, 1 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        if (b == NULL) return NULL;
        Py_DECREF(b);  /* the recorder holds it (self.block) */
        block = PyDict_GetItemWithError(d, s_block);
        if (block == NULL || block == Py_None) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "_open_block opened no block");
            return NULL;
        }
    }
    return block;
}

/* `obj.attr += k` for an int attribute. */
static int attr_add(PyObject *obj, PyObject *attr, Py_ssize_t k) {
    PyObject *v = PyObject_GetAttr(obj, attr);
    if (v == NULL) return -1;
    PyObject *dk = PyLong_FromSsize_t(k);
    PyObject *v2 = dk ? PyNumber_Add(v, dk) : NULL;
    int rc = v2 ? PyObject_SetAttr(obj, attr, v2) : -1;
    Py_XDECREF(v2); Py_XDECREF(dk); Py_DECREF(v);
    return rc;
}

static int malformed(const char *what) {
    if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "malformed plan (%s)", what);
    return -1;
}

/* One step of a plan of several instructions: (op, ospec, mask, attrs, tys, views, first). Appends
   the instruction to the block and its result registers (a tuple) to `results`. 0 or -1. */
static int multi_step(PyObject *step, PyObject *prog, PyObject *types, PyObject *pending, PyObject *pattrs,
                      PyObject *results, PyObject **pregs, Py_ssize_t np, PyObject **outs_t, Py_ssize_t nout) {
    PyObject *op = PyTuple_GET_ITEM(step, 0), *ospec = PyTuple_GET_ITEM(step, 1);
    PyObject *mask = PyTuple_GET_ITEM(step, 2), *attrs = PyTuple_GET_ITEM(step, 3);
    PyObject *tys = PyTuple_GET_ITEM(step, 4), *views = PyTuple_GET_ITEM(step, 5);
    PyObject *rn = PyObject_GetAttr(prog, s_n);
    if (rn == NULL) return -1;
    Py_ssize_t r = PyLong_AsSsize_t(rn);
    Py_DECREF(rn);
    if (r == -1 && PyErr_Occurred()) return -1;
    Py_ssize_t no = PyTuple_GET_SIZE(ospec), nt = PyTuple_GET_SIZE(tys);
    int rc = -1;
    PyObject *outs = NULL, *raw = NULL, *rend = NULL;
    PyObject *regs = PyTuple_New(no);
    if (regs == NULL) return -1;
    for (Py_ssize_t j = 0; j < no; j++) {  /* (kind, x, y): 0 argument x, 1 result y of step x, 2 immediate x */
        PyObject *sp = PyTuple_GET_ITEM(ospec, j), *v = NULL;
        if (!PyTuple_CheckExact(sp) || PyTuple_GET_SIZE(sp) != 3) { malformed("operand"); goto out; }
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(sp, 0));
        if (kind == 0) {
            Py_ssize_t x = PyLong_AsSsize_t(PyTuple_GET_ITEM(sp, 1));
            if (x >= 0 && x < np) v = pregs[x];
        } else if (kind == 1) {
            Py_ssize_t x = PyLong_AsSsize_t(PyTuple_GET_ITEM(sp, 1));
            Py_ssize_t y = PyLong_AsSsize_t(PyTuple_GET_ITEM(sp, 2));
            if (x >= 0 && x < PyList_GET_SIZE(results)) {
                PyObject *ro = PyList_GET_ITEM(results, x);
                if (y >= 0 && y < PyTuple_GET_SIZE(ro)) v = PyTuple_GET_ITEM(ro, y);
            }
        } else if (kind == 2) {
            v = PyTuple_GET_ITEM(sp, 1);
        }
        if (v == NULL) { malformed("operand"); goto out; }
        PyTuple_SET_ITEM(regs, j, Py_NewRef(v));
    }
    outs = PyTuple_New(nt);
    if (outs == NULL) goto out;
    for (Py_ssize_t j = 0; j < nt; j++) {
        PyObject *rr = PyLong_FromSsize_t(r + j);
        if (rr == NULL) goto out;
        PyTuple_SET_ITEM(outs, j, rr);
        if (PyDict_SetItem(types, rr, PyTuple_GET_ITEM(tys, j)) < 0) goto out;
    }
    for (Py_ssize_t v = 0; v < PyTuple_GET_SIZE(views); v++) {  /* (j, k, pair): the layout read off result k */
        PyObject *vw = PyTuple_GET_ITEM(views, v);
        if (!PyTuple_CheckExact(vw) || PyTuple_GET_SIZE(vw) != 3) { malformed("view"); goto out; }
        Py_ssize_t j = PyLong_AsSsize_t(PyTuple_GET_ITEM(vw, 0)), k = PyLong_AsSsize_t(PyTuple_GET_ITEM(vw, 1));
        if (j < 0 || j >= nt || k < 0 || k >= nout) { malformed("view"); goto out; }
        PyObject *c = PyObject_CallOneArg(IS_CONTIG_, outs_t[k]);
        PyObject *ty = c ? PyObject_GetItem(PyTuple_GET_ITEM(vw, 2), c) : NULL;
        Py_XDECREF(c);
        int bad = ty == NULL || PyDict_SetItem(types, PyTuple_GET_ITEM(outs, j), ty) < 0;
        Py_XDECREF(ty);
        if (bad) goto out;
    }
    rend = PyLong_FromSsize_t(r + nt);
    if (rend == NULL || PyObject_SetAttr(prog, s_n, rend) < 0) goto out;
    raw = PyTuple_Pack(4, op, regs, outs, mask);
    if (raw == NULL || PyList_Append(pending, raw) < 0 || PyList_Append(pattrs, attrs) < 0
            || PyList_Append(results, outs) < 0) goto out;
    rc = 0;
out:
    Py_XDECREF(regs); Py_XDECREF(outs); Py_XDECREF(raw); Py_XDECREF(rend);
    return rc;
}

/* last_tags as _read_tags(args, out) makes them: the tags read off the tensor arguments (of the
   legacy form's inputs: `src`) and results. 0 or -1. */
static int read_tags(PyObject *d, PyObject *src, PyObject **outs_t, Py_ssize_t nout) {
    PyObject *at = PyList_New(0), *ot = PyList_New(0), *tags = NULL;
    int bad = at == NULL || ot == NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(src) && !bad; i++) {
        PyObject *a = PyTuple_GET_ITEM(src, i);
        int is_t = (PyObject *)Py_TYPE(a) == TensorType_;
        if (!is_t) {
            is_t = PySet_Contains(ParamTypes_, (PyObject *)Py_TYPE(a));
            if (is_t < 0) { bad = 1; break; }
        }
        if (!is_t) continue;
        PyObject *t = get_tag(a);
        bad = t == NULL || PyList_Append(at, t) < 0;
        Py_XDECREF(t);
    }
    for (Py_ssize_t k = 0; k < nout && !bad; k++) {
        PyObject *t = get_tag(outs_t[k]);
        bad = t == NULL || PyList_Append(ot, t) < 0;
        Py_XDECREF(t);
    }
    if (!bad) tags = PyTuple_Pack(2, at, ot);
    Py_XDECREF(at); Py_XDECREF(ot);
    bad = bad || tags == NULL || PyDict_SetItem(d, s_last_tags, tags) < 0;
    Py_XDECREF(tags);
    return bad ? -1 : 0;
}

/* Recorder._run_multi for a plan hit: the cached lowering of several instructions or results; the
   fresh arguments become inputs before the first step that reads each. 1 recorded, 0 not here
   (nothing changed: a result structure other than the plan's, a result that is not a plain Tensor,
   a fresh argument that may be linked to a view), -1 error. */
static int run_multi(PyObject *rec, PyObject *d, PyObject *name, PyObject *src, PyObject *out,
                     PyObject *plan, PyObject *epoch, PyObject *types, PyObject **pregs, Py_ssize_t np,
                     Fresh *fresh, Py_ssize_t nf) {
    PyObject *steps = PyTuple_GET_ITEM(plan, 1), *louts = PyTuple_GET_ITEM(plan, 2);
    PyObject *ninstr = PyTuple_GET_ITEM(plan, 3);
    if (!PyTuple_CheckExact(steps) || !PyTuple_CheckExact(louts) || !PyLong_CheckExact(ninstr)) return 0;
    PyObject *one_out[1] = {out};
    PyObject **outs_t = one_out;
    Py_ssize_t nout = 1;
    if (PyTuple_CheckExact(out) || PyList_CheckExact(out)) {
        nout = PySequence_Fast_GET_SIZE(out);
        outs_t = PySequence_Fast_ITEMS(out);
    }
    Py_ssize_t nl = PyTuple_GET_SIZE(louts), ns = PyTuple_GET_SIZE(steps);
    if (nout != nl) return 0;
    for (Py_ssize_t k = 0; k < nout; k++) {
        PyObject *lo = PyTuple_GET_ITEM(louts, k);
        if ((PyObject *)Py_TYPE(outs_t[k]) != TensorType_ || !PyTuple_CheckExact(lo) || PyTuple_GET_SIZE(lo) != 3)
            return 0;
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *st = PyTuple_GET_ITEM(steps, i);
        if (!PyTuple_CheckExact(st) || PyTuple_GET_SIZE(st) != 7 || !PyTuple_CheckExact(PyTuple_GET_ITEM(st, 1))
                || !PyTuple_CheckExact(PyTuple_GET_ITEM(st, 4)) || !PyTuple_CheckExact(PyTuple_GET_ITEM(st, 5))
                || !PyTuple_CheckExact(PyTuple_GET_ITEM(st, 6)))
            return 0;
    }
    PyObject *prog = PyDict_GetItemWithError(d, s_program);  /* (opening a block keeps it) */
    if (prog == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *pnames[MAXARGS] = {NULL};
    PyObject *inputs = NULL;
    int rc = 0;
    if (nf) {
        rc = fresh_checks(d, 1, fresh, nf, pnames);  /* (_run_multi: any view candidate, any op) */
        if (rc == 0) {
            inputs = PyObject_GetAttr(prog, s_inputs);
            if (inputs == NULL) rc = -1;
            else if (!PyList_CheckExact(inputs)) rc = 1;
        }
        if (rc != 0) {
            for (Py_ssize_t i = 0; i < nf; i++) Py_XDECREF(pnames[i]);
            Py_XDECREF(inputs);
            return rc < 0 ? -1 : 0;
        }
    }
    rc = -1;
    /* From here on the recorder changes: an error is a recorder error, as on_op's. */
    int again = 0;
    PyObject *pending = NULL, *instrs = NULL, *pattrs = NULL, *results = NULL;
    PyObject *lastouts = NULL, *last = NULL, *st0 = NULL, *st1 = NULL;
    PyObject *block = open_block(rec, d);
    if (block == NULL) goto out;
    pending = PyObject_GetAttr(block, s_pending);
    instrs = pending ? PyObject_GetAttr(block, s_instrs) : NULL;
    pattrs = instrs ? PyObject_GetAttr(block, s_pattrs) : NULL;
    results = pattrs ? PyList_New(0) : NULL;
    if (results == NULL) goto out;
    if (!PyList_CheckExact(pending) || !PyList_CheckExact(instrs) || !PyList_CheckExact(pattrs)) {
        malformed("block");
        goto out;
    }
    Py_ssize_t start = PyList_GET_SIZE(instrs) + PyList_GET_SIZE(pending);
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *step = PyTuple_GET_ITEM(steps, i), *first = PyTuple_GET_ITEM(step, 6);
        for (Py_ssize_t q = 0; nf && q < PyTuple_GET_SIZE(first); q++) {  /* inputs read first here */
            Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(first, q));
            if (k == -1 && PyErr_Occurred()) goto out;
            for (Py_ssize_t f = 0; f < nf; f++)
                if (fresh[f].k == k && pregs[k] == NULL
                        && make_input(prog, inputs, epoch, types, &fresh[f], pnames[f], pregs, &again) < 0)
                    goto out;
        }
        if (multi_step(step, prog, types, pending, pattrs, results, pregs, np, outs_t, nout) < 0) goto out;
    }
    lastouts = PyTuple_New(nl);
    if (lastouts == NULL) goto out;
    PyObject *von = PyDict_GetItemWithError(d, s_views_on);
    if (von == NULL && PyErr_Occurred()) goto out;
    int track = von ? PyObject_IsTrue(von) : 0;
    if (track < 0) goto out;
    for (Py_ssize_t k = 0; k < nl; k++) {  /* (i, j, view): bind the results */
        PyObject *lo = PyTuple_GET_ITEM(louts, k);
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(lo, 0)), j = PyLong_AsSsize_t(PyTuple_GET_ITEM(lo, 1));
        if (i < 0 || i >= PyList_GET_SIZE(results) || j < 0 || j >= PyTuple_GET_SIZE(PyList_GET_ITEM(results, i))) {
            malformed("output");
            goto out;
        }
        PyObject *reg = PyTuple_GET_ITEM(PyList_GET_ITEM(results, i), j);
        PyTuple_SET_ITEM(lastouts, k, Py_NewRef(reg));
        PyObject *tag = PyTuple_Pack(2, epoch, reg);
        if (tag == NULL) goto out;
        PyObject *a[3] = {outs_t[k], KEY_, tag};
        PyObject *sv = PyObject_VectorcallMethod(s_set, a, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(tag);
        if (sv == NULL) goto out;
        Py_DECREF(sv);
        int view = PyObject_IsTrue(PyTuple_GET_ITEM(lo, 2));
        if (view < 0) goto out;
        if (view && track) {  /* self._add_view(t, reg, types[reg]) */
            PyObject *ty = PyDict_GetItemWithError(types, reg);
            if (ty == NULL) { malformed("view type"); goto out; }
            PyObject *b[4] = {rec, outs_t[k], reg, ty};
            PyObject *v = PyObject_VectorcallMethod(s_add_view, b, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (v == NULL) goto out;
            Py_DECREF(v);
        }
    }
    Py_ssize_t n_instrs = PyLong_AsSsize_t(ninstr);
    if (n_instrs == -1 && PyErr_Occurred()) goto out;
    st0 = PyLong_FromSsize_t(start);
    st1 = PyLong_FromSsize_t(start + n_instrs);
    last = (st0 && st1) ? PyTuple_Pack(4, block, st0, st1, lastouts) : NULL;
    if (last == NULL || PyDict_SetItem(d, s_last_op, last) < 0) goto out;
    PyObject *want = PyDict_GetItemWithError(d, s_want_tags);
    int w = want ? PyObject_IsTrue(want) : (PyErr_Occurred() ? -1 : 0);
    if (w < 0 || (w ? read_tags(d, src, outs_t, nout) : PyDict_SetItem(d, s_last_tags, Py_None)) < 0) goto out;
    PyObject *names = PyDict_GetItemWithError(d, s_names);
    if (names == NULL) { malformed("_names"); goto out; }
    if (PyList_Append(names, name) < 0) goto out;
    if (attr_add(METRICS_, s_ops_recorded, 1) < 0 || attr_add(METRICS_, s_instrs_m, n_instrs) < 0) goto out;
    PyObject *mx = PyDict_GetItemWithError(d, s_max_block_ops);
    if (mx == NULL) { malformed("_max_block_ops"); goto out; }
    Py_ssize_t lim = PyLong_AsSsize_t(mx);
    if (lim == -1 && PyErr_Occurred()) goto out;
    if (start + n_instrs >= lim) {
        PyObject *r = PyObject_CallMethodOneArg(rec, s_close_block, s_limit);
        if (r == NULL) goto out;
        Py_DECREF(r);
    }
    n_multi_hits++;
    if (nf) n_fresh_hits++;
    rc = 1;
out:
    for (Py_ssize_t i = 0; i < nf; i++) Py_XDECREF(pnames[i]);
    Py_XDECREF(inputs);
    Py_XDECREF(pending); Py_XDECREF(instrs); Py_XDECREF(pattrs); Py_XDECREF(results);
    Py_XDECREF(lastouts); Py_XDECREF(last); Py_XDECREF(st0); Py_XDECREF(st1);
    return rc;
}

static PyObject *hit_in(PyObject *rec, PyObject *d, PyObject *name, PyObject *args, PyObject *out) {
    STAGE_START();
    if (!PyDict_CheckExact(d) || !PyTuple_CheckExact(args)) Py_RETURN_FALSE;
    if (TensorType_ == NULL) Py_RETURN_FALSE;
    int out_tensor = (PyObject *)Py_TYPE(out) == TensorType_;
    if (!out_tensor && !PyTuple_CheckExact(out) && !PyList_CheckExact(out)) Py_RETURN_FALSE;
    PyObject *plans_all = PyDict_GetItemWithError(d, s_plans);
    if (plans_all == NULL || !PyDict_CheckExact(plans_all)) goto miss_or_err;
    PyObject *plans = PyDict_GetItemWithError(plans_all, name);
    if (plans == NULL || !PyDict_CheckExact(plans)) goto miss_or_err;
    PyObject *recording = PyDict_GetItemWithError(d, s_recording);
    if (recording == NULL || recording != Py_None) goto miss_or_err;
    PyObject *epoch = PyDict_GetItemWithError(d, s_epoch);
    PyObject *types = PyDict_GetItemWithError(d, s_types);
    if (epoch == NULL || types == NULL || !PyDict_CheckExact(types)) goto miss_or_err;
    STAGE(1);

    PyObject *src = args;
    Words kw;
    kw.n = 0; kw.ok = 1;
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    PyObject *legacy = NULL;  /* borrowed: the legacy key part, or NULL */
    if (nargs == 3 && PyUnicode_CheckExact(PyTuple_GET_ITEM(args, 1))
            && PyTuple_CheckExact(PyTuple_GET_ITEM(args, 2))) {
        int eq = PyUnicode_Compare(PyTuple_GET_ITEM(args, 1), name);
        if (eq == -1 && PyErr_Occurred()) return NULL;
        if (eq == 0) {
            src = PyTuple_GET_ITEM(args, 2);  /* legacy primitive: (prim, name, inputs) */
            /* its key part: _LEGACY, or _LEGACY_MIX[dt] under a mixed-precision type (interned) */
            legacy = PyDict_GetItemWithError(d, s_legacy_key);
            if (legacy == NULL) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_AttributeError, "_legacy_key");
                return NULL;
            }
            kw_put(&kw, W_LEGACY);
            kw_put(&kw, (intptr_t)legacy);
        }
    }
    PyObject *pregs[MAXARGS];  /* owned; NULL for a fresh argument until its input is made */
    PyObject *tys[MAXARGS];    /* borrowed: each tensor argument's type */
    Fresh fresh[MAXARGS];
    Py_ssize_t np = 0, nf = 0, n = PyTuple_GET_SIZE(src);
    PyObject *result = NULL;
    PyObject *plan = NULL;  /* owned while in use: the calls below run Python code */
    PyObject *parts = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int rc = key_part(PyTuple_GET_ITEM(src, i), epoch, types, &kw, pregs, tys, &np, fresh, &nf);
        if (rc < 0) goto done;
        if (rc > 0) { result = Py_False; Py_INCREF(result); goto done; }
    }
    STAGE(2);
    plan = ctab_get(plans, &kw);
    if (plan == NULL) {  /* the Python key */
        parts = PyList_New(0);
        if (parts == NULL || (legacy != NULL && PyList_Append(parts, legacy) < 0)) goto done;
        Py_ssize_t j = 0;
        for (Py_ssize_t i = 0; i < n; i++)
            if (py_part(PyTuple_GET_ITEM(src, i), parts, tys, &j) < 0) goto done;
        PyObject *key = PyList_AsTuple(parts);
        if (key == NULL) goto done;
        plan = PyDict_GetItemWithError(plans, key);
        Py_DECREF(key);
        if (plan == NULL) {
            if (PyErr_Occurred()) goto done;
            result = Py_False; Py_INCREF(result); goto done;
        }
        ctab_put(plans, &kw, plan);
    }
    STAGE(3);
    {
        Py_INCREF(plan);
        if (PyTuple_CheckExact(plan) && PyTuple_GET_SIZE(plan) == 5 && PyTuple_GET_ITEM(plan, 0) == MULTI_) {
            /* several instructions or results */
            int rc = run_multi(rec, d, name, src, out, plan, epoch, types, pregs, np, fresh, nf);
            STAGE(11);
            if (rc < 0) goto done;
            result = rc ? Py_True : Py_False; Py_INCREF(result); goto done;
        }
        if (!out_tensor || !PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 8) {
            result = Py_False; Py_INCREF(result); goto done;  /* Python */
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
        PyObject *prog = PyDict_GetItemWithError(d, s_program);  /* (opening a block keeps it) */
        if (prog == NULL) { if (!PyErr_Occurred()) { result = Py_False; Py_INCREF(result); } goto done; }
        if (nf) {  /* the fresh arguments become inputs (Recorder._make_inputs) */
            int rc = make_inputs(d, prog, op, epoch, types, fresh, nf, pregs);
            if (rc < 0) goto done;
            if (rc > 0) { result = Py_False; Py_INCREF(result); goto done; }
        }
        STAGE(4);
        PyObject *block = open_block(rec, d);  /* the op will be recorded: its block */
        if (block == NULL) goto done;
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
        STAGE(5);
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
        STAGE(6);
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
        STAGE(7);
        {
            PyObject *a[3] = {out, KEY_, otag};
            sv = PyObject_VectorcallMethod(s_set, a, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
            if (sv == NULL) goto fail;
        }
        STAGE(8);
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
        STAGE(9);
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
    Py_XDECREF(parts);
    STAGE(10);
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
    PyObject *t, *k, *m, *c, *p, *ty, *pk, *ti, *pi, *tf, *pf, *me;
    if (!PyArg_ParseTuple(args, "OUOOOO!UO!O!OOO", &t, &k, &m, &c, &p, &PyDict_Type, &ty, &pk,
                          &PyList_Type, &ti, &PyDict_Type, &pi, &tf, &pf, &me)) return NULL;
    Py_XSETREF(METRICS_, Py_NewRef(me));
    Py_XSETREF(TYPES_, Py_NewRef(ty)); Py_XSETREF(PKEY_, Py_NewRef(pk));
    Py_XSETREF(TENSOR_INPUTS_, Py_NewRef(ti)); Py_XSETREF(PARAM_INPUTS_, Py_NewRef(pi));
    Py_XSETREF(TENSOR_INPUT_FN_, Py_NewRef(tf)); Py_XSETREF(PARAM_INPUT_FN_, Py_NewRef(pf));
    if (!PySet_Check(p)) { PyErr_SetString(PyExc_TypeError, "setup: a set of Parameter classes"); return NULL; }
    Py_XSETREF(ParamTypes_, Py_NewRef(p));
    Py_XSETREF(IS_CONTIG_, Py_NewRef(c));
    Py_XSETREF(TensorType_, Py_NewRef(t));
    Py_XSETREF(KEY_, Py_NewRef(k));
    Py_XSETREF(MULTI_, Py_NewRef(m));
    ctab_clear();
    Py_RETURN_NONE;
}

static PyObject *stats(PyObject *self, PyObject *unused) {
    return Py_BuildValue("{snsnsnsn}", "fresh_hits", n_fresh_hits, "multi_hits", n_multi_hits,
                         "key_cache_hits", n_ctab_hits, "key_cache_misses", n_ctab_misses);
}

#ifdef DVM_STAGES
/* {stage name: cycles} summed since the last call, then reset. */
static PyObject *stages(PyObject *self, PyObject *unused) {
    PyObject *r = PyDict_New();
    for (int i = 1; r != NULL && i < N_STAGES; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(stage_cycles[i]);
        if (v == NULL || PyDict_SetItemString(r, STAGE_NAMES[i], v) < 0) Py_CLEAR(r);
        Py_XDECREF(v);
        stage_cycles[i] = 0;
    }
    return r;
}
#endif

static PyMethodDef methods[] = {
#ifdef DVM_STAGES
    {"stages", stages, METH_NOARGS, "{stage: cycles} of hit since the last call (built with -DDVM_STAGES)"},
#endif
    {"hit", (PyCFunction)(void (*)(void))hit, METH_FASTCALL, "the plan-cache branch of Recorder.on_op"},
    {"setup", setup, METH_VARARGS, "setup(Tensor, key, multi, is_contiguous, parameter classes, _TYPES, param key, _TENSOR_INPUTS, _PARAM_INPUTS, _tensor_input, _param_input, METRICS)"},
    {"stats", stats, METH_NOARGS, "{'fresh_hits': ops recorded here that made inputs, 'multi_hits': from plans of several instructions, 'key_cache_hits'/'key_cache_misses': plan lookups answered by the C key cache or not}"},
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
    INTERN(s_link_all, "_link_all"); INTERN(s_legacy_key, "_legacy_key"); INTERN(s_link_ops, "_link_ops");
    INTERN(s_max_block_ops, "_max_block_ops"); INTERN(s_ops_recorded, "ops_recorded"); INTERN(s_instrs_m, "instrs");
    if ((ONE = PyLong_FromLong(1)) == NULL) return NULL;
#if HAVE_CTAB
    if ((ctab = PyMem_RawCalloc(CT_SIZE, sizeof(CEnt))) == NULL) return PyErr_NoMemory();
#endif
#undef INTERN
    return PyModule_Create(&moddef);
}
