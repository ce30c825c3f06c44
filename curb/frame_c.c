/* A STOMP frame head's common case in C: the command and the header dict, for the
 * compiled build.
 *
 * curb/frame.py is the codec and its pure-Python build; FrameParser hands this module
 * the head of each frame when it is built (setup.py, beside the mypyc modules). In
 * Python, decoding a head, splitting its lines and filling a dict is a dozen CPython
 * calls and a string per line (about 9,000 instructions for a SEND's head); here it is
 * one call, and the names every frame carries are strings made once.
 *
 * The contract with frame.py: split_head(buf, pos, end) gives what frame.py's own steps
 * give for the head in buf[pos:end] (command, headers: the first of repeated names), or
 * None, which means "not mine": a head with a byte outside ASCII, a CR or a backslash
 * (UTF-8 decoding, CRLF lines and escapes stay frame.py's), or one frame.py refuses
 * (a header line without a colon, an empty name), which frame.py then parses itself to
 * say why. tests/test_frame_c.py compares the two on generated heads.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Commands and header names made once, so that a frame's head needs no new strings for
 * them (and their hashes are kept). */
static const char *const KNOWN[] = {
    "SEND",        "ACK",          "NACK",      "MESSAGE",     "RECEIPT",    "SUBSCRIBE",   "UNSUBSCRIBE",
    "CONNECT",     "STOMP",        "DISCONNECT", "BEGIN",      "COMMIT",     "ABORT",       "ERROR",
    "CONNECTED",   "destination",  "receipt",   "content-length", "content-type", "id",    "ack",
    "persistent",  "subscription", "message-id", "transaction", "receipt-id", "priority", "expires",
    "host",        "accept-version", "heart-beat", "login",    "passcode",   "version",     "server",
    "session",     "message",      "reply-to",  "correlation-id",
};
#define N_KNOWN (sizeof KNOWN / sizeof KNOWN[0])
static PyObject *known_objects[N_KNOWN];
static Py_ssize_t known_sizes[N_KNOWN];

/* A string of the ASCII bytes p[:n]: a known one, or a new one. */
static PyObject *ascii_string(const char *p, Py_ssize_t n)
{
    for (size_t i = 0; i < N_KNOWN; i++) {
        if (known_sizes[i] == n && p[0] == KNOWN[i][0] && memcmp(p, KNOWN[i], (size_t)n) == 0) {
            Py_INCREF(known_objects[i]);
            return known_objects[i];
        }
    }
    PyObject *text = PyUnicode_New(n, 127);
    if (text != NULL)
        memcpy(PyUnicode_DATA(text), p, (size_t)n);
    return text;
}

/* split_head(buf, pos, end): (command, headers) of the head in buf[pos:end], or None. */
static PyObject *split_head(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    const char *buf;
    Py_ssize_t size;
    if (nargs != 3 || !PyLong_Check(args[1]) || !PyLong_Check(args[2]))
        Py_RETURN_NONE;
    if (PyBytes_Check(args[0])) {
        buf = PyBytes_AS_STRING(args[0]);
        size = PyBytes_GET_SIZE(args[0]);
    } else if (PyByteArray_Check(args[0])) {
        buf = PyByteArray_AS_STRING(args[0]);
        size = PyByteArray_GET_SIZE(args[0]);
    } else {
        Py_RETURN_NONE;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]), end = PyLong_AsSsize_t(args[2]);
    if (pos == -1 || end == -1) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    if (pos < 0 || end < pos || end > size)
        Py_RETURN_NONE;
    for (Py_ssize_t i = pos; i < end; i++) {
        unsigned char c = (unsigned char)buf[i];
        if (c >= 0x80 || c == '\r' || c == '\\')
            Py_RETURN_NONE;
    }
    const char *line = buf + pos, *stop = buf + end;
    const char *eol = memchr(line, '\n', (size_t)(stop - line));
    if (eol == NULL)
        eol = stop;
    PyObject *command = ascii_string(line, eol - line);
    PyObject *headers = PyDict_New();
    if (command == NULL || headers == NULL)
        goto fail;
    while (eol < stop) {
        line = eol + 1;
        eol = memchr(line, '\n', (size_t)(stop - line));
        if (eol == NULL)
            eol = stop;
        const char *colon = memchr(line, ':', (size_t)(eol - line));
        if (colon == NULL || colon == line) { /* frame.py says which */
            Py_DECREF(command);
            Py_DECREF(headers);
            Py_RETURN_NONE;
        }
        PyObject *name = ascii_string(line, colon - line);
        if (name == NULL)
            goto fail;
        int seen = PyDict_Contains(headers, name);
        PyObject *value = seen ? NULL : ascii_string(colon + 1, eol - colon - 1);
        if (seen < 0 || (!seen && (value == NULL || PyDict_SetItem(headers, name, value) < 0))) {
            Py_DECREF(name);
            Py_XDECREF(value);
            goto fail;
        }
        Py_DECREF(name);
        Py_XDECREF(value);
    }
    PyObject *pair = PyTuple_Pack(2, command, headers);
    Py_DECREF(command);
    Py_DECREF(headers);
    return pair;
fail:
    Py_XDECREF(command);
    Py_XDECREF(headers);
    return NULL;
}

static PyMethodDef methods[] = {
    {"split_head", (PyCFunction)(void (*)(void))split_head, METH_FASTCALL, "A frame head's command and headers, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "curb.frame_c", "A STOMP frame head's common case in C.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_frame_c(void)
{
    for (size_t i = 0; i < N_KNOWN; i++) {
        if (known_objects[i] == NULL) {
            known_objects[i] = PyUnicode_InternFromString(KNOWN[i]);
            if (known_objects[i] == NULL)
                return NULL;
            known_sizes[i] = (Py_ssize_t)strlen(KNOWN[i]);
        }
    }
    return PyModule_Create(&module);
}
