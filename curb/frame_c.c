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
static PyObject *content_length; /* the header name, one of known_objects */
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

/* The head in buf[pos:end] split: 1 with *command and *headers set (new references), 0
 * when it is not this module's to split, -1 with an exception set. */
static int split(const char *buf, Py_ssize_t pos, Py_ssize_t end, PyObject **command, PyObject **headers)
{
    for (Py_ssize_t i = pos; i < end; i++) {
        unsigned char c = (unsigned char)buf[i];
        if (c >= 0x80 || c == '\r' || c == '\\')
            return 0;
    }
    const char *line = buf + pos, *stop = buf + end;
    const char *eol = memchr(line, '\n', (size_t)(stop - line));
    if (eol == NULL)
        eol = stop;
    *command = ascii_string(line, eol - line);
    *headers = PyDict_New();
    if (*command == NULL || *headers == NULL)
        goto fail;
    while (eol < stop) {
        line = eol + 1;
        eol = memchr(line, '\n', (size_t)(stop - line));
        if (eol == NULL)
            eol = stop;
        const char *colon = memchr(line, ':', (size_t)(eol - line));
        if (colon == NULL || colon == line) { /* frame.py says which */
            Py_CLEAR(*command);
            Py_CLEAR(*headers);
            return 0;
        }
        PyObject *name = ascii_string(line, colon - line);
        if (name == NULL)
            goto fail;
        int seen = PyDict_Contains(*headers, name);
        PyObject *value = seen ? NULL : ascii_string(colon + 1, eol - colon - 1);
        int failed = seen < 0 || (!seen && (value == NULL || PyDict_SetItem(*headers, name, value) < 0));
        Py_DECREF(name);
        Py_XDECREF(value);
        if (failed)
            goto fail;
    }
    return 1;
fail:
    Py_CLEAR(*command);
    Py_CLEAR(*headers);
    return -1;
}

/* A bytes or bytearray argument's bytes; 0 if it is neither. */
static int get_bytes(PyObject *arg, const char **data, Py_ssize_t *size)
{
    if (PyBytes_Check(arg)) {
        *data = PyBytes_AS_STRING(arg);
        *size = PyBytes_GET_SIZE(arg);
        return 1;
    }
    if (PyByteArray_Check(arg)) {
        *data = PyByteArray_AS_STRING(arg);
        *size = PyByteArray_GET_SIZE(arg);
        return 1;
    }
    return 0;
}

/* Non-negative int arguments; 0 (no error set) if one is not. */
static int get_sizes(PyObject *const *args, Py_ssize_t n, Py_ssize_t *out)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyLong_Check(args[i]))
            return 0;
        out[i] = PyLong_AsSsize_t(args[i]);
        if (out[i] < 0) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* split_head(buf, pos, end): (command, headers) of the head in buf[pos:end], or None. */
static PyObject *split_head(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    const char *buf;
    Py_ssize_t size, at[2];
    PyObject *command, *headers;
    if (nargs != 3 || !get_bytes(args[0], &buf, &size) || !get_sizes(args + 1, 2, at) || at[1] < at[0]
        || at[1] > size)
        Py_RETURN_NONE;
    int done = split(buf, at[0], at[1], &command, &headers);
    if (done <= 0)
        return done < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *pair = PyTuple_Pack(2, command, headers);
    Py_DECREF(command);
    Py_DECREF(headers);
    return pair;
}

/* A content-length's common case as frame.py reads it: 1 to 9 ASCII digits; -1 if not. */
static Py_ssize_t short_length(PyObject *text)
{
    if (!PyUnicode_Check(text) || !PyUnicode_IS_ASCII(text))
        return -1;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), value = 0;
    const char *digits = (const char *)PyUnicode_DATA(text);
    if (n < 1 || n > 9)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (digits[i] < '0' || digits[i] > '9')
            return -1;
        value = value * 10 + (digits[i] - '0');
    }
    return value;
}

/* next_frame(buf, pos, max_frame, max_body, short_head): the whole frame at buf[pos:],
 * after any EOLs (heart-beats), as (command, headers, body, where the bytes after its
 * NUL start), when frame.py would take it whole without a check of its own; else None.
 * That is: its head ends at an LF LF, holds no CR, is at most short_head bytes and is
 * split here; its content-length, if any, is 1 to 9 digits; it is within the limits and
 * complete, its NUL where it belongs. Anything else (an incomplete frame, a limit, an
 * error to name) frame.py parses itself, from pos. */
static PyObject *next_frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    (void)self;
    const char *buf;
    Py_ssize_t size, at[4];
    if (nargs != 5 || !get_bytes(args[0], &buf, &size) || !get_sizes(args + 1, 4, at))
        Py_RETURN_NONE;
    Py_ssize_t pos = at[0], max_frame = at[1], max_body = at[2], short_head = at[3];
    while (pos < size && (buf[pos] == '\n' || (buf[pos] == '\r' && pos + 1 < size && buf[pos + 1] == '\n')))
        pos += buf[pos] == '\n' ? 1 : 2;
    if (pos >= size)
        Py_RETURN_NONE;
    Py_ssize_t scan_to = pos + short_head + 2 < size ? pos + short_head + 2 : size;
    const char *head_end = NULL;
    for (const char *p = buf + pos; p + 1 < buf + scan_to; p++) {
        p = memchr(p, '\n', (size_t)(buf + scan_to - p - 1));
        if (p == NULL)
            break;
        if (p[1] == '\n') {
            head_end = p;
            break;
        }
    }
    if (head_end == NULL || head_end - (buf + pos) > short_head)
        Py_RETURN_NONE;
    Py_ssize_t head = head_end - buf, body = head + 2;
    if (body - pos > max_frame)
        Py_RETURN_NONE;
    PyObject *command, *headers;
    int done = split(buf, pos, head, &command, &headers);
    if (done <= 0)
        return done < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *raw_length = PyDict_GetItemWithError(headers, content_length);
    Py_ssize_t nul;
    if (raw_length != NULL) {
        Py_ssize_t length = short_length(raw_length);
        nul = body + length;
        if (length < 0 || length > max_body || nul - pos > max_frame || nul >= size || buf[nul] != '\0')
            goto not_mine;
    } else if (PyErr_Occurred()) {
        goto fail;
    } else {
        const char *found = memchr(buf + body, '\0', (size_t)(size - body));
        nul = found == NULL ? -1 : found - buf;
        if (nul < 0 || nul - body > max_body || nul - pos > max_frame)
            goto not_mine;
    }
    PyObject *bytes = PyBytes_FromStringAndSize(buf + body, nul - body);
    PyObject *next = bytes == NULL ? NULL : PyLong_FromSsize_t(nul + 1);
    PyObject *frame = next == NULL ? NULL : PyTuple_Pack(4, command, headers, bytes, next);
    Py_XDECREF(bytes);
    Py_XDECREF(next);
    Py_DECREF(command);
    Py_DECREF(headers);
    return frame;
not_mine:
    Py_DECREF(command);
    Py_DECREF(headers);
    Py_RETURN_NONE;
fail:
    Py_DECREF(command);
    Py_DECREF(headers);
    return NULL;
}

static PyMethodDef methods[] = {
    {"split_head", (PyCFunction)(void (*)(void))split_head, METH_FASTCALL, "A frame head's command and headers, or None."},
    {"next_frame", (PyCFunction)(void (*)(void))next_frame, METH_FASTCALL, "The whole simple frame at pos, or None."},
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
            if (strcmp(KNOWN[i], "content-length") == 0)
                content_length = known_objects[i];
        }
    }
    return PyModule_Create(&module);
}
