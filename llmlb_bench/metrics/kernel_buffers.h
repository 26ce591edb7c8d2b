/* Arrays handed to the C kernels (report_kernels.c, cache_kernels.c) through the buffer protocol:
 * each kernel takes its arguments' buffers into one Buffers, checked for kind and contiguity, and
 * releases them all on its way out (``bad`` on an error). One copy for both kernels' files, so that
 * the checks they make of their inputs are the same. Its hash is in the compiled core's manifest
 * (compiled_core.KERNEL_HEADERS): a change makes the core stale, as a change of a kernel does. */
#ifndef LLMLB_KERNEL_BUFFERS_H
#define LLMLB_KERNEL_BUFFERS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MAXBUF 12

typedef struct {
    Py_buffer view[MAXBUF];
    int n;
} Buffers;

static void release(Buffers *b) {
    for (int i = 0; i < b->n; i++) PyBuffer_Release(&b->view[i]);
    b->n = 0;
}

/* kind: 'd' float64, 'q' int64, 'Q' uint64, 'i' int32, 'I' uint32, 'H' uint16, 'B' uint8, '?' bool. Returns the data pointer and its length in items, or NULL
 * with an exception set. */
static void *take(Buffers *b, PyObject *obj, char kind, int writable, Py_ssize_t *len, const char *name) {
    Py_buffer *v = &b->view[b->n];
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, v, flags) < 0) return NULL;
    b->n++;
    const char *f = v->format ? v->format : "B";
    if (*f == '@' || *f == '=' || *f == '<') f++;
    int ok;
    if (kind == 'd') ok = v->itemsize == 8 && strcmp(f, "d") == 0;
    else if (kind == 'q') ok = v->itemsize == 8 && (strcmp(f, "q") == 0 || strcmp(f, "l") == 0);
    else if (kind == 'Q') ok = v->itemsize == 8 && (strcmp(f, "Q") == 0 || strcmp(f, "L") == 0);
    else if (kind == 'i') ok = v->itemsize == 4 && (strcmp(f, "i") == 0 || strcmp(f, "l") == 0);
    else if (kind == 'I') ok = v->itemsize == 4 && (strcmp(f, "I") == 0 || strcmp(f, "L") == 0);
    else if (kind == 'H') ok = v->itemsize == 2 && strcmp(f, "H") == 0;
    else if (kind == 'B') ok = v->itemsize == 1 && strcmp(f, "B") == 0;
    else ok = v->itemsize == 1 && strcmp(f, "?") == 0;
    if (!ok) {
        PyErr_Format(PyExc_TypeError, "%s: expected a contiguous %s array", name,
                     kind == 'd' ? "float64" : kind == 'q' ? "int64" : kind == 'Q' ? "uint64" : kind == 'i' ? "int32"
                     : kind == 'I' ? "uint32" : kind == 'H' ? "uint16" : kind == 'B' ? "uint8" : "bool");
        return NULL;
    }
    *len = v->len / v->itemsize;
    return v->buf;
}

static PyObject *bad(Buffers *b, const char *what) {
    release(b);
    PyErr_SetString(PyExc_ValueError, what);
    return NULL;
}

#endif
