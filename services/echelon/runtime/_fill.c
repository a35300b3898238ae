/* A topic's schema compiled into one C function: the compiled twin of the Python function
 * that runtime/schema_code.py writes per schema (that one is the reference; the two must
 * give the same answer and fill the same map for every input, tests/unit/test_schema_fill.py).
 *
 * Fill(names, kinds, lows, highs, limits, costs, size_limit)(m, out): for each declared
 * attribute, in `names`' order, look it up in the request's map `m`, compare its kind
 * with the one its type takes, check its bounds (Python's own comparison: NaN fails) or
 * its length, set it into the Event's map `out`; then count unknown attributes out
 * (len(m)) and check the size. Returns (names, values..., kinds of float attributes...)
 * or None, as the Python function does. The work per attribute is the protobuf calls;
 * what this saves is the interpreter's dispatch around them (docs/performance.md,
 * "A compiled hot path").
 *
 * Plain CPython C API, no dependency: built by `pip install` when a compiler is there
 * (setup.py, an optional extension); runtime/schema_code.py falls back to Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

enum { KIND_STRING = 0, KIND_INT = 1, KIND_FLOAT = 2 };

static PyObject *s_get, *s_which, *s_kind, *s_string_value, *s_int_value, *s_float_value;

typedef struct {
    PyObject_HEAD
    Py_ssize_t n;         /* attributes */
    Py_ssize_t nfloats;   /* of which FLOAT */
    PyObject *names;      /* tuple of str, the order of the checks and of the result */
    int *kinds;
    PyObject *lows;       /* tuple: numbers' bounds (None for strings) */
    PyObject *highs;
    Py_ssize_t *limits;   /* strings' longest value in UTF-8 bytes */
    Py_ssize_t *costs;    /* bytes an attribute adds to the size: strings add their length too */
    Py_ssize_t size_limit;
} Fill;

static void Fill_dealloc(Fill *self) {
    Py_XDECREF(self->names);
    Py_XDECREF(self->lows);
    Py_XDECREF(self->highs);
    PyMem_Free(self->kinds);
    PyMem_Free(self->limits);
    PyMem_Free(self->costs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ssize_items(PyObject *tuple, Py_ssize_t n, Py_ssize_t *out) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t v = PyLong_AsSsize_t(PyTuple_GET_ITEM(tuple, i));
        if (v == -1 && PyErr_Occurred())
            return -1;
        out[i] = v;
    }
    return 0;
}

static PyObject *Fill_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *names, *kinds, *lows, *highs, *limits, *costs;
    Py_ssize_t size_limit;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Fill takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!n:Fill", &PyTuple_Type, &names, &PyTuple_Type, &kinds, &PyTuple_Type,
                          &lows, &PyTuple_Type, &highs, &PyTuple_Type, &limits, &PyTuple_Type, &costs, &size_limit))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(kinds) != n || PyTuple_GET_SIZE(lows) != n || PyTuple_GET_SIZE(highs) != n ||
        PyTuple_GET_SIZE(limits) != n || PyTuple_GET_SIZE(costs) != n) {
        PyErr_SetString(PyExc_ValueError, "Fill: one entry per attribute in every tuple");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(names, i))) {
            PyErr_SetString(PyExc_TypeError, "Fill: attribute names are str");
            return NULL;
        }
    }
    Fill *self = (Fill *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->n = n;
    self->kinds = PyMem_Calloc(n ? n : 1, sizeof(int));
    self->limits = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    self->costs = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    Py_INCREF(names);
    self->names = names;
    Py_INCREF(lows);
    self->lows = lows;
    Py_INCREF(highs);
    self->highs = highs;
    self->size_limit = size_limit;
    if (self->kinds == NULL || self->limits == NULL || self->costs == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long k = PyLong_AsLong(PyTuple_GET_ITEM(kinds, i));
        if (k == -1 && PyErr_Occurred()) {
            Py_DECREF(self);
            return NULL;
        }
        if (k != KIND_STRING && k != KIND_INT && k != KIND_FLOAT) {
            Py_DECREF(self);
            PyErr_SetString(PyExc_ValueError, "Fill: a kind is 0 (string), 1 (int) or 2 (float)");
            return NULL;
        }
        self->kinds[i] = (int)k;
        self->nfloats += k == KIND_FLOAT;
    }
    if (ssize_items(limits, n, self->limits) < 0 || ssize_items(costs, n, self->costs) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* `out[name].<field> = x` */
static int set_into(PyObject *out, PyObject *name, PyObject *field, PyObject *x) {
    PyObject *value = PyObject_GetItem(out, name);
    if (value == NULL)
        return -1;
    int r = PyObject_SetAttr(value, field, x);
    Py_DECREF(value);
    return r;
}

/* 1 when low <= x <= high, 0 when not, -1 on error: Python's chained comparison. */
static int within(PyObject *low, PyObject *x, PyObject *high) {
    int r = PyObject_RichCompareBool(low, x, Py_LE);
    if (r <= 0)
        return r;
    return PyObject_RichCompareBool(x, high, Py_LE);
}

/* result[i] = x, taking x's reference (the slot held None). */
static void put(PyObject *result, Py_ssize_t i, PyObject *x) {
    PyObject *old = PyTuple_GET_ITEM(result, i);
    PyTuple_SET_ITEM(result, i, x);
    Py_DECREF(old);
}

static int kind_is(PyObject *c, const char *kind) {
    return PyUnicode_Check(c) && PyUnicode_CompareWithASCIIString(c, kind) == 0;
}

#define FAIL_IF(cond) \
    if (cond) \
    goto fail
#define NO_IF(cond) \
    if (cond) \
    goto no

static PyObject *Fill_call(Fill *self, PyObject *args, PyObject *kwds) {
    PyObject *m, *out;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "fill takes positional arguments only");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "fill", 2, 2, &m, &out))
        return NULL;
    Py_ssize_t n = self->n, seen = 0, size = 0, f = 0;
    /* the result: names, then each value (None when absent), then each float's kind */
    PyObject *result = PyTuple_New(1 + n + self->nfloats);
    if (result == NULL)
        return NULL;
    Py_INCREF(self->names);
    PyTuple_SET_ITEM(result, 0, self->names);
    for (Py_ssize_t i = 1; i < 1 + n + self->nfloats; i++) {
        Py_INCREF(Py_None);
        PyTuple_SET_ITEM(result, i, Py_None);
    }
    PyObject *get = PyObject_GetAttr(m, s_get), *v = NULL, *c = NULL, *x = NULL;
    FAIL_IF(get == NULL);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(self->names, i);
        int kind = self->kinds[i];
        v = PyObject_CallOneArg(get, name);
        FAIL_IF(v == NULL);
        if (v == Py_None) {
            Py_CLEAR(v);
            f += kind == KIND_FLOAT;
            continue;
        }
        seen++;
        c = PyObject_CallMethodOneArg(v, s_which, s_kind);
        FAIL_IF(c == NULL);
        if (kind == KIND_FLOAT) {
            Py_INCREF(c);
            put(result, 1 + n + f, c);
            f++;
        }
        if (kind == KIND_STRING) {
            NO_IF(!kind_is(c, "string_value"));
            x = PyObject_GetAttr(v, s_string_value);
            FAIL_IF(x == NULL);
            FAIL_IF(!PyUnicode_Check(x));
            Py_ssize_t s;
            if (PyUnicode_IS_ASCII(x)) {
                s = PyUnicode_GET_LENGTH(x);
            } else {
                PyObject *b = PyUnicode_AsEncodedString(x, "utf-8", "surrogatepass");
                FAIL_IF(b == NULL);
                s = PyBytes_GET_SIZE(b);
                Py_DECREF(b);
            }
            NO_IF(s > self->limits[i]);
            size += s + self->costs[i];
            FAIL_IF(set_into(out, name, s_string_value, x) < 0);
        } else {
            PyObject *field;
            if (kind == KIND_FLOAT && kind_is(c, "float_value"))
                field = s_float_value;
            else if (kind_is(c, "int_value"))  /* a float attribute takes an int as it is */
                field = s_int_value;
            else
                goto no;
            x = PyObject_GetAttr(v, field);
            FAIL_IF(x == NULL);
            int ok = within(PyTuple_GET_ITEM(self->lows, i), x, PyTuple_GET_ITEM(self->highs, i));
            FAIL_IF(ok < 0);
            NO_IF(!ok);
            FAIL_IF(set_into(out, name, field, x) < 0);
            size += self->costs[i];
        }
        put(result, 1 + i, x);
        x = NULL;
        Py_CLEAR(c);
        Py_CLEAR(v);
    }
    Py_CLEAR(get);
    Py_ssize_t len = PyObject_Size(m);
    FAIL_IF(len < 0);
    NO_IF(seen != len || size > self->size_limit);
    return result;
no:
    Py_XDECREF(get);
    Py_XDECREF(v);
    Py_XDECREF(c);
    Py_XDECREF(x);
    Py_DECREF(result);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(get);
    Py_XDECREF(v);
    Py_XDECREF(c);
    Py_XDECREF(x);
    Py_DECREF(result);
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "fill: a string attribute's value is not str");
    return NULL;
}

static PyObject *Fill_repr(Fill *self) {
    return PyUnicode_FromFormat("<compiled fill of %R>", self->names);
}

static PyTypeObject FillType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "echelon.runtime._fill.Fill",
    .tp_basicsize = sizeof(Fill),
    .tp_dealloc = (destructor)Fill_dealloc,
    .tp_repr = (reprfunc)Fill_repr,
    .tp_call = (ternaryfunc)Fill_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Fill(names, kinds, lows, highs, limits, costs, size_limit): a schema's fill(m, out), compiled.",
    .tp_new = Fill_new,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fill", "A schema's fill, compiled (runtime/schema_code.py is the reference).", -1, NULL,
};

PyMODINIT_FUNC PyInit__fill(void) {
    if (PyType_Ready(&FillType) < 0)
        return NULL;
#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
    return NULL
    INTERN(s_get, "get");
    INTERN(s_which, "WhichOneof");
    INTERN(s_kind, "kind");
    INTERN(s_string_value, "string_value");
    INTERN(s_int_value, "int_value");
    INTERN(s_float_value, "float_value");
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&FillType);
    if (PyModule_AddObject(m, "Fill", (PyObject *)&FillType) < 0) {
        Py_DECREF(&FillType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
