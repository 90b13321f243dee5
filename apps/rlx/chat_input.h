/* rlx chat's input: messages of one or more lines, typed on a terminal or read from a pipe. */
#ifndef RLX_APP_CHAT_INPUT_H
#define RLX_APP_CHAT_INPUT_H

#include <signal.h>
#include <stddef.h>

/* The longest message taken, in bytes: far more than a context holds, and a bound on what a
 * runaway pipe can make the reader keep. */
#define CHAT_MAX_MESSAGE (16u << 20)

typedef struct chat_input chat_input;

/* Reads standard input. A terminal is put in raw mode until chat_input_close: the reader echoes
 * and edits the line itself (no canonical-mode limit on its length) and keys typed while a
 * reply streams are not echoed; chat_input_restore_terminal undoes it from a signal handler.
 * *interrupted is what the SIGINT handler sets. NULL after reporting. */
chat_input *chat_input_open(volatile sig_atomic_t *interrupted);

int chat_input_is_terminal(const chat_input *in);

/* The next message, without its final line break: 1 with *text (NUL-terminated, valid until the
 * next call), 0 at the end of the input (Ctrl-D at an empty prompt). A line ending in a backslash
 * goes on on the next line; lines between two lines of three double quotes are one message; a
 * paste (bracketed, or lines arriving at once) is one message. Ctrl-C at the prompt clears it. */
int chat_input_read(chat_input *in, const char **text, size_t *len);

/* After a reply on a terminal: discards the keys typed while it streamed, saying so. */
void chat_input_discard_typed(chat_input *in);

void chat_input_close(chat_input *in);

/* Puts the terminal back as chat_input_open found it; async-signal-safe. */
void chat_input_restore_terminal(void);

#endif
