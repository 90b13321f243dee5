/* rlx chat's input. A terminal's canonical mode cuts a line at 4095 bytes without a word and
 * sends a pasted message line by line, so on a terminal the reader takes the keys in raw mode
 * and edits the line itself: characters are appended, Backspace, Ctrl-U and Ctrl-W erase within
 * the line being typed, and a line too long for the screen wraps (its rows are redrawn after an
 * erase). A pipe is read line by line. Both join lines into one message as llama.cpp's console
 * does: a line ending in a backslash goes on, and lines between two `"""` lines are one message;
 * on a terminal a paste is one message too. */
#include "chat_input.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>
#include <utf8proc.h>

#include "cli.h"

/* xterm's bracketed paste: the terminal marks a paste, so its line breaks do not send it */
#define PASTE_ON "\033[?2004h"
#define PASTE_OFF "\033[?2004l"
#define FIRST_PROMPT "> "
#define NEXT_PROMPT "... "

/* The terminal's settings before raw mode, for chat_input_restore_terminal (a signal handler). */
static struct termios saved_terminal;
static volatile sig_atomic_t terminal_raw;

struct chat_input {
    int terminal;
    int echo_fd; /* where a terminal's prompt and echo go: stderr, or the terminal itself */
    volatile sig_atomic_t *interrupted;
    char *msg; /* the message so far: msg[0 .. len), NUL-terminated when returned */
    size_t len, cap;
    size_t line_start; /* where the line being typed starts in msg */
    int in_block;      /* between `"""` lines */
    int too_long;      /* more than CHAT_MAX_MESSAGE bytes came: the message is dropped, saying so */
    const char *prompt;
    unsigned char keys[4096]; /* a terminal's bytes read and not yet handled */
    size_t key_pos, n_keys;
    char out[8192]; /* echo not yet written */
    size_t n_out;
    char *line; /* a pipe's current line */
    size_t line_cap;
};

void chat_input_restore_terminal(void) {
    if (!terminal_raw)
        return;
    tcsetattr(STDIN_FILENO, TCSANOW, &saved_terminal);
    if (write(isatty(STDERR_FILENO) ? STDERR_FILENO : STDIN_FILENO, PASTE_OFF, sizeof PASTE_OFF - 1) < 0) {
        /* nothing to do about a terminal that is gone */
    }
    terminal_raw = 0;
}

static void flush_echo(chat_input *in) {
    for (size_t done = 0; done < in->n_out;) {
        ssize_t n = write(in->echo_fd, in->out + done, in->n_out - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* a terminal that takes no output: the message is still read */
        done += (size_t)n;
    }
    in->n_out = 0;
}

static void echo(chat_input *in, const char *text, size_t n) {
    while (n) {
        if (in->n_out == sizeof in->out)
            flush_echo(in);
        size_t room = sizeof in->out - in->n_out, take = n < room ? n : room;
        memcpy(in->out + in->n_out, text, take);
        in->n_out += take;
        text += take;
        n -= take;
    }
}

static void echo_str(chat_input *in, const char *text) { echo(in, text, strlen(text)); }

static void show_prompt(chat_input *in, const char *prompt) {
    in->prompt = prompt;
    echo_str(in, prompt);
    flush_echo(in);
}

chat_input *chat_input_open(volatile sig_atomic_t *interrupted) {
    chat_input *in = calloc(1, sizeof *in);
    if (!in) {
        app_fail("chat: out of memory");
        return NULL;
    }
    in->interrupted = interrupted;
    in->terminal = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_terminal) == 0;
    in->echo_fd = isatty(STDERR_FILENO) ? STDERR_FILENO : STDIN_FILENO;
    if (in->terminal) {
        /* ISIG stays: Ctrl-C stops a reply and clears the prompt through SIGINT */
        struct termios raw = saved_terminal;
        raw.c_lflag &= ~(tcflag_t)(ECHO | ICANON | IEXTEN);
        raw.c_cc[VMIN] = 1;
        raw.c_cc[VTIME] = 0;
        terminal_raw = 1; /* before the change: a signal in between restores what is saved anyway */
        if (tcsetattr(STDIN_FILENO, TCSANOW, &raw) != 0) {
            terminal_raw = 0;
            in->terminal = 0; /* read it as a stream of lines, which still works */
        } else {
            echo_str(in, PASTE_ON);
        }
    }
    return in;
}

int chat_input_is_terminal(const chat_input *in) { return in->terminal; }

void chat_input_close(chat_input *in) {
    if (!in)
        return;
    flush_echo(in);
    chat_input_restore_terminal();
    free(in->msg);
    free(in->line);
    free(in);
}

void chat_input_discard_typed(chat_input *in) {
    if (!in->terminal)
        return;
    int typed = 0; /* without ICANON this counts every key, not only finished lines */
    if (ioctl(STDIN_FILENO, FIONREAD, &typed) != 0)
        typed = 0;
    tcflush(STDIN_FILENO, TCIFLUSH);
    in->key_pos = in->n_keys = 0;
    if (typed > 0)
        fprintf(stderr, "rlx chat: what you typed during the reply was discarded\n");
}

/* Appends to the message, unless that makes it longer than CHAT_MAX_MESSAGE. */
static int add(chat_input *in, const char *text, size_t n) {
    if (in->too_long || in->len + n > CHAT_MAX_MESSAGE) {
        in->too_long = 1;
        return -1;
    }
    if (in->len + n + 1 > in->cap) {
        size_t cap = (in->len + n + 1) * 2;
        char *grown = realloc(in->msg, cap);
        if (!grown) {
            in->too_long = 1; /* reported as too long for the memory there is */
            return -1;
        }
        in->msg = grown;
        in->cap = cap;
    }
    memcpy(in->msg + in->len, text, n);
    in->len += n;
    return 0;
}

static void start_message(chat_input *in) {
    in->len = in->line_start = 0;
    in->in_block = in->too_long = 0;
}

/* The line msg[line_start .. len) has ended: 1 when it ends the message, 0 when the message goes
 * on on the next line (whose start is then line_start). */
static int line_done(chat_input *in) {
    const char *line = in->msg + in->line_start;
    const size_t n = in->len - in->line_start;
    const int fence = n == 3 && memcmp(line, "\"\"\"", 3) == 0;
    if (in->in_block && fence) {
        in->len = in->line_start ? in->line_start - 1 : 0; /* the closing line and the break before it */
        in->in_block = 0;
        return 1;
    }
    if (!in->in_block && fence && in->line_start == 0) {
        in->in_block = 1;
        in->len = 0;
        return 0;
    }
    if (!in->in_block) {
        if (n == 0 || line[n - 1] != '\\')
            return 1;
        in->len--; /* the backslash only says that the message goes on */
    }
    add(in, "\n", 1);
    in->line_start = in->len;
    return 0;
}

/* What a finished message leaves to the caller: 1 with the text, or 0 (dropped: start again). */
static int finish(chat_input *in, const char **text, size_t *len) {
    if (in->too_long) {
        fprintf(stderr, "rlx chat: the message is longer than %u MiB (or than the memory there is); it was not sent\n",
                CHAT_MAX_MESSAGE >> 20);
        return 0;
    }
    if (!in->msg && add(in, "", 0) < 0)
        return 0;
    in->msg[in->len] = '\0';
    *text = in->msg;
    *len = in->len;
    return 1;
}

// ---- a pipe ----

/* The next line of stdin without its line break (and a '\r' before it) in in->line, keeping at
 * most CHAT_MAX_MESSAGE + 1 bytes of it (the rest is read and dropped); -1 at the end or after
 * Ctrl-C (*interrupted), else the length. */
static ssize_t pipe_line(chat_input *in) {
    if (!in->line && !(in->line = malloc(in->line_cap = 1 << 16)))
        return -1;
    size_t n = 0;
    int any = 0;
    for (;;) {
        if (n + 2 > in->line_cap && in->line_cap <= CHAT_MAX_MESSAGE) {
            char *grown = realloc(in->line, in->line_cap * 2);
            if (grown) {
                in->line = grown;
                in->line_cap *= 2;
            }
        }
        const int c = getc(stdin);
        if (c == EOF)
            return any ? (ssize_t)n : -1;
        any = 1;
        if (c == '\n')
            break;
        if (n + 2 <= in->line_cap)
            in->line[n++] = (char)c;
        else
            in->too_long = 1;
    }
    if (n && in->line[n - 1] == '\r')
        n--;
    return (ssize_t)n;
}

static int read_pipe(chat_input *in, const char **text, size_t *len) {
    for (start_message(in);;) {
        ssize_t n = pipe_line(in);
        if (n < 0 && *in->interrupted && ferror(stdin)) { /* Ctrl-C: what was read of the message is dropped */
            clearerr(stdin);
            *in->interrupted = 0;
            start_message(in);
            continue;
        }
        if (n < 0) /* the end: an unfinished message is still sent */
            return in->len || in->too_long ? finish(in, text, len) : 0;
        add(in, in->line, (size_t)n);
        if (line_done(in)) {
            if (finish(in, text, len))
                return 1;
            start_message(in);
        }
    }
}

// ---- a terminal ----

/* The next byte typed: -1 at the end of the input, -2 after Ctrl-C. */
static int next_key(chat_input *in) {
    if (in->key_pos < in->n_keys)
        return in->keys[in->key_pos++];
    flush_echo(in);
    for (;;) {
        ssize_t n = read(STDIN_FILENO, in->keys, sizeof in->keys);
        if (n > 0) {
            in->n_keys = (size_t)n;
            in->key_pos = 1;
            return in->keys[0];
        }
        if (n < 0 && errno == EINTR && *in->interrupted)
            return -2;
        if (n == 0 || errno != EINTR)
            return -1;
    }
}

/* Whether more input is there already: a line break followed at once by more is part of a paste,
 * as no one types that fast. */
static int more_waiting(const chat_input *in) {
    struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
    return in->key_pos < in->n_keys || poll(&p, 1, 0) > 0;
}

static int terminal_columns(const chat_input *in) {
    struct winsize ws;
    if (ioctl(in->echo_fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    return 80;
}

/* Columns the line being typed takes, with its prompt: tabs show as a space, bytes that are no
 * UTF-8 as one column each. */
static size_t line_columns(const chat_input *in) {
    size_t cols = strlen(in->prompt);
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)in->msg + in->line_start;
    for (utf8proc_ssize_t left = (utf8proc_ssize_t)(in->len - in->line_start); left > 0;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t step = utf8proc_iterate(p, left, &cp);
        if (step <= 0) {
            cols++;
            step = 1;
        } else {
            cols += cp == '\t' ? 1 : (size_t)utf8proc_charwidth(cp);
        }
        p += step;
        left -= step;
    }
    return cols;
}

/* Echoes text as it shows: a tab as a space, a line break with the prompt of the next line. */
static void echo_text(chat_input *in, const char *text, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (text[i] == '\n') {
            echo_str(in, "\n");
            in->prompt = NEXT_PROMPT;
            echo_str(in, NEXT_PROMPT);
        } else {
            echo(in, text[i] == '\t' ? " " : text + i, 1);
        }
    }
}

/* Draws the line being typed again after an erase, from the row where it starts; it took
 * `before` columns, and a terminal keeps the cursor on the last column of a row it just filled. */
static void redraw_line(chat_input *in, size_t before) {
    const size_t cols = (size_t)terminal_columns(in);
    const size_t rows_up = before > 0 && before % cols == 0 ? before / cols - 1 : before / cols;
    char move[32];
    snprintf(move, sizeof move, rows_up ? "\r\033[%zuA\033[J" : "\r\033[J", rows_up);
    echo_str(in, move);
    echo_str(in, in->prompt);
    echo_text(in, in->msg + in->line_start, in->len - in->line_start);
}

enum erase { ERASE_CHAR, ERASE_WORD, ERASE_LINE };

static void erase(chat_input *in, enum erase what) {
    if (in->len == in->line_start || in->too_long)
        return;
    const size_t before = line_columns(in);
    size_t at = in->len;
    if (what == ERASE_LINE) {
        at = in->line_start;
    } else if (what == ERASE_WORD) {
        while (at > in->line_start && (in->msg[at - 1] == ' ' || in->msg[at - 1] == '\t'))
            at--;
        while (at > in->line_start && in->msg[at - 1] != ' ' && in->msg[at - 1] != '\t')
            at--;
    } else {
        at--; /* back to the first byte of the last UTF-8 character */
        while (at > in->line_start && ((unsigned char)in->msg[at] & 0xC0) == 0x80)
            at--;
    }
    in->len = at;
    redraw_line(in, before);
}

/* Typed or pasted text: kept and echoed; a line break in it starts a line of the message. */
static void insert(chat_input *in, const char *text, size_t n) {
    if (add(in, text, n) < 0)
        return; /* said when the message ends */
    echo_text(in, text, n);
    for (size_t i = 0; i < n; i++)
        if (text[i] == '\n')
            in->line_start = in->len - n + i + 1;
}

/* After ESC: a bracketed paste's start or end mark, or a key (an arrow, ...) the reader does not
 * edit with, skipped. Returns the paste state. */
static int escape(chat_input *in, int pasting) {
    if (!more_waiting(in))
        return pasting; /* the Esc key alone */
    int c = next_key(in);
    if (c == 'O') { /* SS3: one more byte */
        next_key(in);
        return pasting;
    }
    if (c != '[')
        return pasting;
    char params[16];
    size_t n = 0;
    while ((c = next_key(in)) >= 0x20 && c <= 0x3F)
        if (n + 1 < sizeof params)
            params[n++] = (char)c;
    params[n] = '\0';
    if (c == '~' && strcmp(params, "200") == 0)
        return 1;
    if (c == '~' && strcmp(params, "201") == 0)
        return 0;
    return pasting;
}

static int read_terminal(chat_input *in, const char **text, size_t *len) {
    start_message(in);
    show_prompt(in, FIRST_PROMPT);
    for (int pasting = 0;;) {
        int c = next_key(in);
        if (c == -2) { /* Ctrl-C at the prompt: cleared, and asked again */
            *in->interrupted = 0;
            echo_str(in, "\n");
            start_message(in);
            pasting = 0;
            show_prompt(in, FIRST_PROMPT);
            continue;
        }
        if (c == -1 ||
            (c == 0x04 && in->len == 0 && !in->in_block)) { /* Ctrl-D: the shell's prompt on a line of its own */
            echo_str(in, "\n");
            flush_echo(in);
            return 0;
        }
        if (c == '\r')
            c = '\n'; /* a paste's line breaks, when the terminal sends them as typed Enter keys */
        if (c == '\n' && !pasting && !more_waiting(in)) {
            if (!line_done(in)) {
                echo_text(in, "\n", 1);
                continue;
            }
            echo_str(in, "\n");
            flush_echo(in);
            if (finish(in, text, len))
                return 1;
            start_message(in);
            show_prompt(in, FIRST_PROMPT);
        } else if (c == 0x1B) {
            pasting = escape(in, pasting);
        } else if (c == 0x7F || c == 0x08) {
            erase(in, ERASE_CHAR);
        } else if (c == 0x17) {
            erase(in, ERASE_WORD);
        } else if (c == 0x15) {
            erase(in, ERASE_LINE);
        } else if (c == '\n' || c == '\t' || c >= 0x20) {
            char byte = (char)c;
            insert(in, &byte, 1);
        }
    }
}

int chat_input_read(chat_input *in, const char **text, size_t *len) {
    return in->terminal ? read_terminal(in, text, len) : read_pipe(in, text, len);
}
