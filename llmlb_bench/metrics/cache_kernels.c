/* The prefix-cache accounting's pass over a piece of sorted keys in C: what
 * llmlb_bench/metrics/cache_accounting.py's _account_piece does in NumPy passes, done here in one pass
 * per hash, with the same integer operations (64-bit, wrapping as NumPy's), so that the leading counts
 * are the NumPy path's exactly. The NumPy code stays the reference (tests/test_cache_accounting.py
 * runs both and compares them).
 *
 * Built by setup.py beside the compiled simulator core (compiled_core.KERNELS) and loaded only while
 * the core is; without it the NumPy code runs. Arrays come through the buffer protocol (NumPy arrays,
 * C-contiguous, int64: the keys as their int64 view; the per-slot figures side by side). No NumPy headers: the build needs only Python's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_buffers.h"

/* wrapping 64-bit arithmetic, as NumPy's int64 */
static inline int64_t add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t sub(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static inline int64_t mul(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }

/* piece(key, splits, table, lowest, low_bits, pos_bits, levels, stride, renumber, targets): lowers
 * ``lowest`` (per slot and level) by a piece of sorted keys (_account_piece's docstring has the walk).
 * ``table`` holds per slot, side by side (one cache line per block read): give, ready_needs,
 * reach_needs, arrival. A hash starts at the first key, where the key bits change and at each of
 * ``splits`` (ascending); its number is the key bits (``renumber`` 0) or its count in the piece from
 * 1, times ``stride`` where there are targets. */
static PyObject *piece(PyObject *self, PyObject *args) {
    PyObject *o[4];
    int low_bits, pos_bits, levels, renumber, targets;
    long long stride;
    if (!PyArg_ParseTuple(args, "OOOOiiiLii", &o[0], &o[1], &o[2], &o[3], &low_bits, &pos_bits, &levels, &stride,
                          &renumber, &targets))
        return NULL;
    Buffers b = {.n = 0};
    Py_ssize_t size, ns, nt, nl;
    const int64_t *key = take(&b, o[0], 'q', 0, &size, "key");
    const int64_t *splits = key ? take(&b, o[1], 'q', 0, &ns, "splits") : NULL;
    const int64_t *table = splits ? take(&b, o[2], 'q', 0, &nt, "table") : NULL;
    int64_t *lowest = table ? take(&b, o[3], 'q', 1, &nl, "lowest") : NULL;
    if (!lowest) { release(&b); return NULL; }
    if (low_bits < 1 || low_bits > 63 || pos_bits < 1 || pos_bits >= low_bits || levels < 1 ||
        (targets && levels != 3) || (!targets && levels != 1))
        return bad(&b, "bad key layout");
    Py_ssize_t slots = nt / 4;
    if (nt != slots * 4 || nl != slots * levels) return bad(&b, "arrays of different lengths");
    const uint64_t lowmask = ((uint64_t)1 << low_bits) - 1, posmask = ((uint64_t)1 << pos_bits) - 1;
    for (Py_ssize_t i = 0; i < size; i++)   /* every name's slot in range: checked once, before any write */
        if ((Py_ssize_t)(((uint64_t)key[i] & lowmask) >> pos_bits) >= slots) return bad(&b, "a key names no slot");
    for (Py_ssize_t j = 0; j < ns; j++)
        if (splits[j] < 0 || splits[j] >= size || (j && splits[j] <= splits[j - 1])) return bad(&b, "bad splits");
    /* the misses of one hash: a buffer kept between calls (a fresh one per call cost a page fault per
     * 4 KB); the GIL is held throughout */
    static int64_t *miss = NULL;
    static Py_ssize_t room = 0;
    if (room < size + 1) {
        int64_t *grown = realloc(miss, sizeof(int64_t) * (size_t)(size + 1));
        if (!grown) { release(&b); return PyErr_NoMemory(); }
        miss = grown;
        room = size + 1;
    }
    int64_t run = 0, count = 0;
    Py_ssize_t sp = 0, i = 0;
    while (i < size) {
        /* the hash starting at i: up to the next change of the key bits or split */
        uint64_t field = (uint64_t)key[i] >> low_bits;
        if (sp < ns && splits[sp] == i) sp++;
        Py_ssize_t e = i + 1;
        Py_ssize_t next_split = sp < ns ? (Py_ssize_t)splits[sp] : size;
        while (e < size && e < next_split && ((uint64_t)key[e] >> low_bits) == field) e++;
        count++;
        int64_t number = renumber ? count : (int64_t)field;
        int64_t first = INT64_MAX;
        Py_ssize_t m = 0;
        if (!targets) {
            for (Py_ssize_t k = i; k < e; k++) {
                int64_t a = table[4 * (((uint64_t)key[k] & lowmask) >> pos_bits) + 3];
                if (a < first) first = a;
            }
            for (Py_ssize_t k = i; k < e; k++) {
                uint64_t name = (uint64_t)key[k] & lowmask;
                Py_ssize_t slot = (Py_ssize_t)(name >> pos_bits);
                int64_t pos = (int64_t)(name & posmask);
                int64_t low = lowest[slot];
                lowest[slot] = table[4 * slot + 3] == first && pos < low ? pos : low;
            }
        } else {
            number = mul(number, (int64_t)stride);
            for (Py_ssize_t k = i; k < e; k++) {
                Py_ssize_t slot = (Py_ssize_t)(((uint64_t)key[k] & lowmask) >> pos_bits);
                const int64_t *t = table + 4 * slot;
                int64_t before = k ? sub(run, number) : -((int64_t)1 << 62);
                int64_t r = add(t[0], number);
                if (!k || r > run) run = r;
                if (t[1] >= before) {
                    miss[m++] = (int64_t)((uint64_t)k << 1 | (uint64_t)(t[2] < before));
                    if (t[3] < first) first = t[3];
                }
            }
            for (Py_ssize_t q = 0; q < m; q++) {
                uint64_t name = (uint64_t)key[miss[q] >> 1] & lowmask;
                Py_ssize_t slot = (Py_ssize_t)(name >> pos_bits);
                int64_t pos = (int64_t)(name & posmask);
                Py_ssize_t at = slot * 3 + (Py_ssize_t)(miss[q] & 1) + (table[4 * slot + 3] != first);
                int64_t low = lowest[at];
                lowest[at] = pos < low ? pos : low;
            }
        }
        i = e;
    }
    release(&b);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"piece", piece, METH_VARARGS, "Lower the leading counts by a piece of sorted keys, in place."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "cache_kernels", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_cache_kernels(void) { return PyModule_Create(&module); }
