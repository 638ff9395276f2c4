/* mock_server_main.c - the mock HTTP server (mock_server.h) as a program, for the Lua specs: prints
 * its port on one line, serves until GET /quit or for at most SECONDS (default 300), then stops.
 * usage: mock_server [SECONDS] */
#include "mock_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
  long seconds = argc > 1 ? strtol(argv[1], NULL, 10) : 300;
  mock_server *s = mock_server_start();
  if (!s) {
    fprintf(stderr, "mock_server: cannot listen on 127.0.0.1\n");
    return 1;
  }
  printf("%d\n", mock_server_port(s));
  fflush(stdout);
  struct timespec tick = {0, 20 * 1000000L};
  for (long waited = 0; waited < seconds * 50 && !mock_server_quit_requested(s); waited++)
    nanosleep(&tick, NULL);
  mock_server_stop(s);
  return 0;
}
