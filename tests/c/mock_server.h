/* mock_server.h - a scripted HTTP/1.1 server on 127.0.0.1 for the HTTP client's tests (C and Lua):
 * answers by path, injects faults, counts connections and requests. Test code only.
 *
 * Routes (query parameters in brackets; `key` names a counter of hits, so that "the first `fail`
 * hits" is per key):
 *   /echo                    200, JSON {method, path, query, body, authorization, x_test}
 *   /status?code&key&fail&retry_after&retry_after_ms&should_retry
 *                            `code` (with the headers given) for the first `fail` hits of key
 *                            (every hit when fail is absent), then 200 "ok"
 *   /reset?key&fail          reads the request, then resets the connection (TCP RST) before any
 *                            byte, for the first `fail` hits (every hit without fail); then "ok"
 *   /sse?n&delay_ms&reset_after&eol&key
 *                            text/event-stream of n events `data: {"i":k}` (then `data: [DONE]`),
 *                            each after delay_ms, lines ended by eol = lf|crlf|cr; reset_after=m
 *                            resets the connection after m events
 *   /slow?ms                 waits ms before answering "ok" (the client's total timeout)
 *   /stall?ms                sends the headers and 2 bytes, then nothing for ms (idle timeout)
 *   /hold?ms                 waits ms, then "ok"; in-flight requests are counted
 *   /stats                   JSON {requests, connections, open, max_open, inflight, max_inflight,
 *                            hits = {key: n}}; /reset_stats zeroes them (open connections stay)
 *                            and empties the log
 *   /requests                JSON {now, dropped, requests = [{t, path, body}]}: every request but
 *                            /requests, /stats, /reset_stats and /quit, in order of arrival, t its
 *                            CLOCK_MONOTONIC seconds when it was read (the clock of rl.clock), the
 *                            path without its query; past 16384 entries only counted in dropped
 *   /code/N/<route>          answers status N with an OpenAI-shaped error, whatever <route> is
 *   /delay/MS/<route>        waits MS milliseconds, then answers as /<route> (a slow server)
 *   /v1/completions          vLLM-shaped completion for a token-id prompt (return_token_ids)
 *   /generate                SGLang-shaped, for input_ids
 *   /completion              llama.cpp-shaped, for a token-array prompt (n_probs)
 *   /v1/chat/completions     OpenAI-shaped chat reply "reply to: <last message content>",
 *                            streamed as chunks when "stream": true; for a model named "verdict..."
 *                            the reply is "yes" when the content's first "answer: " is followed by
 *                            a lowercase letter, else "no"; for the model "ranker" it is
 *                            "Ranking: k1 k2 ...", the candidates of the lines "[k] ... <number>"
 *                            by their number, largest first; the model "unknown" gets a 404
 *   /quit                    "bye", then the server stops accepting (the standalone program ends)
 * The three generation routes give the same tokens for the same prompt and max tokens:
 * token k = (31 * sum(prompt) + 7 * k) % 1000 + 1, logprob k = -(k + 1) / 8, finish "length". */
#ifndef MRL_MOCK_SERVER_H
#define MRL_MOCK_SERVER_H

typedef struct mock_server mock_server;

/* Starts serving on an ephemeral loopback port; NULL when the socket cannot be made. */
mock_server *mock_server_start(void);
int mock_server_port(const mock_server *s);
/* Whether /quit was requested. */
int mock_server_quit_requested(mock_server *s);
/* Stops accepting, closes every connection and joins the server's threads. */
void mock_server_stop(mock_server *s);

#endif /* MRL_MOCK_SERVER_H */
