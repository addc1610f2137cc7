/*
 * tidelog._crc32c: CRC-32C (Castagnoli) of many byte ranges of one buffer in one call.
 *
 * What it is. tidelog stores one CRC-32C per record, over the record's bytes [4, size)
 * (docs/format.md). Every read checks every record and every append computes every record's
 * checksum; done one Python call per record, the call cost most of the time. The two functions
 * here take a whole batch: the buffer, and the records' ranges as int64 arrays (any object with
 * the buffer protocol; numpy arrays in tidelog), and make no Python object per record.
 *
 *   crc32c_ranges(data, starts, ends, out, *, portable=False)
 *       out[i] = CRC-32C of data[starts[i]:ends[i]] for every i.
 *   stamp_record_crcs(data, positions, sizes, *, portable=False)
 *       for every record i at data[positions[i] : positions[i] + sizes[i]], writes the CRC-32C
 *       of its bytes [4, size) into its bytes [0, 4), little-endian (the record format's CRC
 *       field), in place.
 *   hardware() -> bool
 *       whether the SSE4.2 crc32 instruction is used (portable=False).
 *
 * Invariants. The result is the standard CRC-32C (reflected polynomial 0x82F63B78, initial value
 * and final xor 0xFFFFFFFF), the one the crc32c package computes, on either path. Nothing is read
 * or written outside the buffers: the arrays must be one-dimensional and C-contiguous with the
 * right item type (int64 ranges, uint32 out), of equal lengths, and every range is checked against
 * the buffer just before it is read (ValueError names the first bad one; the results before it
 * are already written). The int64 arrays are read once per element, into locals, so an array
 * changed by another thread while the GIL is released can only give a wrong result or the error,
 * never a read outside the buffer.
 *
 * Theory of operation. On x86-64 CPUs with SSE4.2 (checked once at import,
 * __builtin_cpu_supports) the crc32 instruction consumes eight bytes per step; the function
 * is compiled for SSE4.2 alone (a target attribute), so the module itself runs on any x86-64.
 * Elsewhere, and when portable=True (the tests compare both), a table-driven slicing-by-8 pass:
 * eight 256-entry tables, eight bytes per step, loaded byte by byte so it is endian-neutral.
 * Passes over 64 KiB or more of buffer release the GIL; the buffers stay exported (Py_buffer)
 * until the pass ends, so they cannot be resized or freed under it.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TIDELOG_X86 1
#include <nmmintrin.h>
#endif

#define POLYNOMIAL 0x82F63B78u
#define RELEASE_GIL_BYTES 65536

typedef uint32_t (*crc_fn)(uint32_t, const uint8_t *, size_t);

static uint32_t table[8][256];

static void build_tables(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) {
            c = (c & 1) ? (c >> 1) ^ POLYNOMIAL : c >> 1;
        }
        table[0][b] = c;
    }
    for (int t = 1; t < 8; t++) {
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t previous = table[t - 1][b];
            table[t][b] = (previous >> 8) ^ table[0][previous & 0xFF];
        }
    }
}

/* Continues the register (the CRC before its final inversion) over n bytes: slicing-by-8. */
static uint32_t update_portable(uint32_t crc, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint32_t low = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                              (uint32_t)p[3] << 24);
        crc = table[7][low & 0xFF] ^ table[6][(low >> 8) & 0xFF] ^ table[5][(low >> 16) & 0xFF] ^
              table[4][low >> 24] ^ table[3][p[4]] ^ table[2][p[5]] ^ table[1][p[6]] ^
              table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) {
        crc = table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    }
    return crc;
}

#ifdef TIDELOG_X86
/* The same with the SSE4.2 crc32 instruction, eight bytes per step. */
__attribute__((target("sse4.2"))) static uint32_t update_sse42(uint32_t crc, const uint8_t *p,
                                                               size_t n) {
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        c = _mm_crc32_u64(c, word);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    if (n >= 4) {
        uint32_t word;
        memcpy(&word, p, 4);
        c32 = _mm_crc32_u32(c32, word);
        p += 4;
        n -= 4;
    }
    while (n--) {
        c32 = _mm_crc32_u8(c32, *p++);
    }
    return c32;
}
#endif

static crc_fn hardware_update = NULL; /* set at import when the CPU has the instruction */

static crc_fn chosen(int portable) {
    return (portable || hardware_update == NULL) ? update_portable : hardware_update;
}

/* A one-dimensional C-contiguous array of `itemsize`-byte items whose struct format is one of
 * `codes` (an optional byte-order prefix for the native order allowed). */
static int get_array(PyObject *obj, Py_buffer *view, int flags, Py_ssize_t itemsize,
                     const char *codes, const char *what, const char *name) {
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    const char *format = view->format ? view->format : "B";
    if (*format == '@' || *format == '=' || (PY_LITTLE_ENDIAN && *format == '<') ||
        (!PY_LITTLE_ENDIAN && *format == '>')) {
        format++;
    }
    if (view->ndim != 1 || view->itemsize != itemsize || format[0] == '\0' ||
        format[1] != '\0' || strchr(codes, format[0]) == NULL) {
        PyErr_Format(PyExc_TypeError,
                     "%s must be a one-dimensional contiguous array of %s, not one of format '%s' "
                     "with %zd dimension(s) and %zd-byte items",
                     name, what, view->format ? view->format : "B", (Py_ssize_t)view->ndim,
                     view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Both int64 arrays, of one length. */
static int get_pair(PyObject *first, PyObject *second, Py_buffer *a, Py_buffer *b,
                    const char *first_name, const char *second_name) {
    if (get_array(first, a, PyBUF_SIMPLE, 8, "ql", "int64", first_name) < 0) {
        return -1;
    }
    if (get_array(second, b, PyBUF_SIMPLE, 8, "ql", "int64", second_name) < 0) {
        PyBuffer_Release(a);
        return -1;
    }
    if (a->len != b->len) {
        PyErr_Format(PyExc_ValueError, "%zd %s but %zd %s", a->len / 8, first_name, b->len / 8,
                     second_name);
        PyBuffer_Release(a);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

static PyObject *crc32c_ranges(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"", "", "", "", "portable", NULL};
    PyObject *data_obj, *starts_obj, *ends_obj, *out_obj;
    (void)self;
    int portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|$p:crc32c_ranges", keywords, &data_obj,
                                     &starts_obj, &ends_obj, &out_obj, &portable)) {
        return NULL;
    }
    Py_buffer data, starts, ends, out;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (get_pair(starts_obj, ends_obj, &starts, &ends, "starts", "ends") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (get_array(out_obj, &out, PyBUF_WRITABLE, 4, "IL", "uint32", "out") < 0) {
        goto release;
    }
    Py_ssize_t n = starts.len / 8;
    if (out.len / 4 != n) {
        PyErr_Format(PyExc_ValueError, "out holds %zd items for %zd ranges", out.len / 4, n);
        PyBuffer_Release(&out);
        goto release;
    }
    crc_fn update = chosen(portable);
    const uint8_t *bytes = data.buf;
    const int64_t *s = starts.buf, *e = ends.buf;
    uint32_t *o = out.buf;
    Py_ssize_t size = data.len, bad = -1;
    int64_t bad_start = 0, bad_end = 0;
    PyThreadState *saved = size >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t a = s[i], b = e[i];
        if (a < 0 || a > b || b > size) {
            bad = i, bad_start = a, bad_end = b;
            break;
        }
        o[i] = ~update(0xFFFFFFFFu, bytes + a, (size_t)(b - a));
    }
    if (saved) {
        PyEval_RestoreThread(saved);
    }
    PyBuffer_Release(&out);
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError,
                     "range %zd, [%lld, %lld), is not within the buffer of %zd bytes", bad,
                     (long long)bad_start, (long long)bad_end, size);
        goto release;
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    Py_RETURN_NONE;
release:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&ends);
    return NULL;
}

static PyObject *stamp_record_crcs(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"", "", "", "portable", NULL};
    PyObject *data_obj, *positions_obj, *sizes_obj;
    (void)self;
    int portable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|$p:stamp_record_crcs", keywords,
                                     &data_obj, &positions_obj, &sizes_obj, &portable)) {
        return NULL;
    }
    Py_buffer data, positions, sizes;
    if (PyObject_GetBuffer(data_obj, &data, PyBUF_WRITABLE) < 0) {
        return NULL;
    }
    if (get_pair(positions_obj, sizes_obj, &positions, &sizes, "positions", "sizes") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    crc_fn update = chosen(portable);
    uint8_t *bytes = data.buf;
    const int64_t *p = positions.buf, *z = sizes.buf;
    Py_ssize_t n = positions.len / 8, size = data.len, bad = -1;
    int64_t bad_position = 0, bad_size = 0;
    PyThreadState *saved = size >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t at = p[i], length = z[i];
        if (at < 0 || length < 4 || length > size - at) {
            bad = i, bad_position = at, bad_size = length;
            break;
        }
        uint32_t crc = ~update(0xFFFFFFFFu, bytes + at + 4, (size_t)(length - 4));
        uint8_t *field = bytes + at;
        field[0] = (uint8_t)crc;
        field[1] = (uint8_t)(crc >> 8);
        field[2] = (uint8_t)(crc >> 16);
        field[3] = (uint8_t)(crc >> 24);
    }
    if (saved) {
        PyEval_RestoreThread(saved);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&sizes);
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError,
                     "record %zd, %lld bytes at %lld, is not a record within the buffer of %zd "
                     "bytes (at least 4 bytes, its CRC field)",
                     bad, (long long)bad_size, (long long)bad_position, size);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *hardware(PyObject *self, PyObject *unused) {
    (void)self, (void)unused;
    return PyBool_FromLong(hardware_update != NULL);
}

static PyMethodDef methods[] = {
    {"crc32c_ranges", (PyCFunction)(void (*)(void))crc32c_ranges, METH_VARARGS | METH_KEYWORDS,
     "crc32c_ranges(data, starts, ends, out, *, portable=False)\n--\n\n"
     "out[i] = CRC-32C of data[starts[i]:ends[i]] (int64 starts and ends, uint32 out)."},
    {"stamp_record_crcs", (PyCFunction)(void (*)(void))stamp_record_crcs,
     METH_VARARGS | METH_KEYWORDS,
     "stamp_record_crcs(data, positions, sizes, *, portable=False)\n--\n\n"
     "Writes each record's CRC-32C of its bytes [4, size) into its bytes [0, 4), little-endian."},
    {"hardware", hardware, METH_NOARGS,
     "hardware()\n--\n\nWhether the CPU's crc32 instruction is used (SSE4.2)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    "tidelog._crc32c",
    "CRC-32C of many byte ranges of one buffer in one call (src/tidelog/native/crc32c.c).",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC PyInit__crc32c(void) {
    build_tables();
#ifdef TIDELOG_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) {
        hardware_update = update_sse42;
    }
#endif
    return PyModule_Create(&module);
}
