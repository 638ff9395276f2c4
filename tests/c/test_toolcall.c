/* test_toolcall.c - tool calls in moonrl serve (engine/src/serve/toolcall.c), without a server:
 * tools and tool_choice read from JSON (and refused with the field named), calls read out of
 * generated text in the hermes and line formats, assistant calls rendered back, and the automaton
 * that constrains a forced call: it takes well-formed calls byte by byte, refuses what would break
 * one, and is done exactly at the call's end. */
#include "support.h"

#include "../../engine/src/serve/toolcall.h"

#include <stdio.h>
#include <string.h>

#define CHECK_OK(call) CHECKF((call) == MRL_OK, "%s failed", #call)
#define CHECK_EQ_INT(want, got)                                                                  \
  CHECKF((long long)(want) == (long long)(got), "%s: %lld, want %lld", #got, (long long)(got),  \
         (long long)(want))
#define CHECK_EQ_STR(want, got) check_str((want), (got), #got, __LINE__)

static void check_str(const char *want, const char *got, const char *expr, int line) {
  if (!got) got = "(null)";
  CHECKF(!strcmp(want, got), "line %d: %s: '%s', want '%s'", line, expr, got, want);
}
#define CHECK_FAIL(...) CHECKF(false, __VA_ARGS__)

static const char TOOLS[] =
    "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"now\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"},"
    " \"days\": {\"type\": \"integer\"}, \"metric\": {\"type\": \"boolean\"}}}}},"
    " {\"type\": \"function\", \"function\": {\"name\": \"now\"}}]";

typedef struct {
  mrl_engine *e;
  mrl_json_doc *tools, *choice;
  srv_tools ts;
} fixture;

/* Reads TOOLS with tool_choice `choice` (JSON text, or NULL); returns whether it was accepted,
 * with the message in err. */
static bool read_tools(fixture *f, int format, const char *tools, const char *choice, char *err,
                       const char **param) {
  CHECK_OK(mrl_engine_new(&f->e));
  CHECK_OK(mrl__json_parse(f->e, "test", "tools", tools, strlen(tools), &f->tools));
  f->choice = NULL;
  if (choice) CHECK_OK(mrl__json_parse(f->e, "test", "choice", choice, strlen(choice), &f->choice));
  return mrl__tools_read(&f->ts, format, mrl__json_root(f->tools),
                         f->choice ? mrl__json_root(f->choice) : NULL, true, err, 256, param);
}

static void done(fixture *f) {
  mrl__tools_free(&f->ts);
  mrl__json_free(f->tools);
  mrl__json_free(f->choice);
  mrl_engine_free(f->e);
}

static void test_reads_tools_and_choice(void) {
  char err[256];
  const char *param;
  fixture f;
  CHECK(read_tools(&f, TOOL_FORMAT_HERMES, TOOLS, "{\"type\": \"function\", \"function\": "
                                                  "{\"name\": \"now\"}}", err, &param));
  CHECK_EQ_INT(2, f.ts.n);
  CHECK_EQ_INT(TOOL_CHOICE_FUNCTION, f.ts.choice);
  CHECK_EQ_INT(1, f.ts.forced);
  CHECK_EQ_INT(3, f.ts.tools[0].n_params);
  CHECK_EQ_STR("days", f.ts.tools[0].params[1]);
  CHECK_EQ_STR("sib", f.ts.tools[0].param_types);
  CHECK_EQ_INT(0, f.ts.tools[1].n_params);
  CHECK(strstr(f.ts.tools[0].schema, "\"name\":\"get_weather\",\"description\":\"now\"") != NULL);
  done(&f);

  static const struct {
    const char *tools, *choice, *param, *message;
  } bad[] = {
      {"[]", NULL, "tools", "1 to 128"},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]", NULL, "tools",
       "[A-Za-z0-9_-]"},
      {"[{\"type\": \"retrieval\", \"function\": {\"name\": \"a\"}}]", NULL, "tools",
       "\"function\""},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"extra\": 1}}]", NULL, "tools",
       "unknown field 'extra'"},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a\"}}, {\"type\": \"function\", "
       "\"function\": {\"name\": \"a\"}}]",
       NULL, "tools", "used twice"},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": 3}}]", NULL,
       "tools", "JSON Schema"},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a\"}}]", "\"sometimes\"",
       "tool_choice", "\"required\""},
      {"[{\"type\": \"function\", \"function\": {\"name\": \"a\"}}]",
       "{\"type\": \"function\", \"function\": {\"name\": \"b\"}}", "tool_choice",
       "not in 'tools'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK(!read_tools(&f, TOOL_FORMAT_HERMES, bad[i].tools, bad[i].choice, err, &param));
    CHECK_EQ_STR(bad[i].param, param);
    if (!strstr(err, bad[i].message)) CHECK_FAIL("case %zu: '%s' lacks '%s'", i, err, bad[i].message);
    done(&f);
  }
}

/* Parses text against TOOLS; returns the number of calls, with content and calls as strings. */
static int parse(int format, bool parallel, const char *text, char *content, char *calls) {
  char err[256];
  const char *param;
  fixture f;
  CHECK(read_tools(&f, format, TOOLS, NULL, err, &param));
  f.ts.parallel = parallel;
  srv_buf c = {0}, k = {0};
  int n = mrl__tools_parse(&f.ts, f.e, text, strlen(text), "cmpl-7", false, &c, &k);
  snprintf(content, 512, "%s", c.p ? c.p : "");
  snprintf(calls, 1024, "%s", k.p ? k.p : "");
  mrl__sb_free(&c);
  mrl__sb_free(&k);
  done(&f);
  return n;
}

static void test_parses_hermes_calls(void) {
  char content[512], calls[1024];
  CHECK_EQ_INT(2, parse(TOOL_FORMAT_HERMES, true,
                        "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                        "{\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>{\"name\":"
                        "\"now\"}</tool_call>",
                        content, calls));
  CHECK_EQ_STR("Let me look.", content);
  CHECK_EQ_STR("[{\"id\":\"call_cmpl-7_0\",\"type\":\"function\",\"function\":{\"name\":"
               "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\",\\\"days\\\":2}\"}},"
               "{\"id\":\"call_cmpl-7_1\",\"type\":\"function\",\"function\":{\"name\":\"now\","
               "\"arguments\":\"{}\"}}]",
               calls);
  /* parallel_tool_calls false: the first call only */
  CHECK_EQ_INT(1, parse(TOOL_FORMAT_HERMES, false,
                        "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>"
                        "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>",
                        content, calls));
  CHECK_EQ_STR("", content);
  CHECK(strstr(calls, "call_cmpl-7_1") == NULL);
  /* arguments given as a string holding the object; numbers written back exactly */
  CHECK_EQ_INT(1, parse(TOOL_FORMAT_HERMES, true,
                        "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"days\\\": "
                        "0.1, \\\"metric\\\": true}\"}</tool_call>",
                        content, calls));
  CHECK(strstr(calls, "{\\\"days\\\":0.1,\\\"metric\\\":true}") != NULL);
  /* not calls: plain text, an unknown tool, broken JSON, an unclosed block, array arguments */
  static const char *const plain[] = {
      "just text",
      "<tool_call>{\"name\": \"rain\", \"arguments\": {}}</tool_call>",
      "<tool_call>{\"name\": \"now\", \"arguments\": {</tool_call>",
      "<tool_call>{\"name\": \"now\", \"arguments\": {}}",
      "<tool_call>{\"name\": \"now\", \"arguments\": [1]}</tool_call>",
  };
  for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
    CHECK_EQ_INT(0, parse(TOOL_FORMAT_HERMES, true, plain[i], content, calls));
}

static void test_parses_line_calls(void) {
  char content[512], calls[1024];
  CHECK_EQ_INT(1, parse(TOOL_FORMAT_LINE, true,
                        "thinking\nCALL get_weather \"New York\" 3 true\nafter", content, calls));
  CHECK_EQ_STR("thinking\nafter", content);
  CHECK(strstr(calls, "\"arguments\":\"{\\\"city\\\":\\\"New York\\\",\\\"days\\\":3,"
                      "\\\"metric\\\":true}\"") != NULL);
  /* types from the schema: a word where an integer belongs stays a string */
  CHECK_EQ_INT(1, parse(TOOL_FORMAT_LINE, true, "CALL get_weather Oslo many", content, calls));
  CHECK(strstr(calls, "\\\"days\\\":\\\"many\\\"") != NULL);
  CHECK_EQ_INT(1, parse(TOOL_FORMAT_LINE, true, "CALL now", content, calls));
  CHECK(strstr(calls, "\"name\":\"now\",\"arguments\":\"{}\"") != NULL);
  /* more arguments than parameters, an open quote, an unknown tool, no CALL line */
  static const char *const plain[] = {"CALL now 1", "CALL get_weather \"Oslo", "CALL rain",
                                      "ANSWER 4"};
  for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
    CHECK_EQ_INT(0, parse(TOOL_FORMAT_LINE, true, plain[i], content, calls));
}

static void test_renders_earlier_calls(void) {
  mrl_engine *e;
  CHECK_OK(mrl_engine_new(&e));
  const char *calls = "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": "
                      "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"New York\\\", "
                      "\\\"days\\\": 2}\"}}]";
  mrl_json_doc *doc;
  CHECK_OK(mrl__json_parse(e, "test", "calls", calls, strlen(calls), &doc));
  char err[256];
  srv_buf h = {0}, l = {0};
  CHECK(mrl__tools_render_calls(TOOL_FORMAT_HERMES, mrl__json_root(doc), e, &h, err, sizeof err));
  CHECK_EQ_STR("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"New York\","
               "\"days\":2}}\n</tool_call>",
               h.p);
  CHECK(mrl__tools_render_calls(TOOL_FORMAT_LINE, mrl__json_root(doc), e, &l, err, sizeof err));
  CHECK_EQ_STR("CALL get_weather \"New York\" 2", l.p);
  mrl__sb_free(&h);
  mrl__sb_free(&l);
  mrl__json_free(doc);
  const char *bad = "[{\"function\": {\"name\": \"x\", \"arguments\": \"{nope\"}}]";
  CHECK_OK(mrl__json_parse(e, "test", "calls", bad, strlen(bad), &doc));
  CHECK(!mrl__tools_render_calls(TOOL_FORMAT_HERMES, mrl__json_root(doc), e, &h, err, sizeof err));
  CHECK(strstr(err, "JSON object") != NULL);
  mrl__sb_free(&h);
  mrl__json_free(doc);
  mrl_engine_free(e);
}

/* Feeds text to a fresh automaton for (format, choice) byte by byte: the number of bytes it
 * took before refusing one (strlen when it took all), and whether it ended done. */
static size_t feed(int format, const char *choice, const char *text, bool *is_done) {
  char err[256];
  const char *param;
  fixture f;
  CHECK(read_tools(&f, format, TOOLS, choice, err, &param));
  tc_state st;
  mrl__tc_start(&st, &f.ts);
  size_t n = strlen(text), i = 0;
  for (; i < n; i++) {
    tc_state copy = st;
    if (!mrl__tc_feed(&copy, &f.ts, text + i, 1)) break;
    st = copy;
  }
  *is_done = mrl__tc_done(&st);
  done(&f);
  return i;
}

static void test_forced_call_automaton(void) {
  const char *req = "\"required\"";
  const char *now = "{\"type\": \"function\", \"function\": {\"name\": \"now\"}}";
  bool fin;
  static const char *const good[] = {
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\\u00e9\\n\", "
      "\"days\":-1.5e+3,\"metric\":false,\"x\":[null,true,{},[]]}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>",
      "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
  };
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    CHECK_EQ_INT((long long)strlen(good[i]), (long long)feed(TOOL_FORMAT_HERMES, req, good[i], &fin));
    CHECK(fin);
  }
  /* each refused at a known byte: where the call would break */
  static const struct {
    const char *text;
    size_t took;
  } bad[] = {
      {"<tool_call>\n{\"name\": \"rain\"", 22},              /* no tool starts with r */
      {"<tool_call>\n{\"name\": \"now\", \"arguments\": {\"a\"", 42}, /* now takes {} only */
      {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": [", 49}, /* not an object */
      {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"a\":01", 55}, /* leading 0 */
      {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"a\":  1", 55}, /* 2 blanks */
      {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"a\":\"\x01", 55}, /* control */
      {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>x", 65},
      {"Sure! <tool_call>", 0},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t took = feed(TOOL_FORMAT_HERMES, req, bad[i].text, &fin);
    if (took != bad[i].took) CHECK_FAIL("case %zu: took %zu bytes, want %zu", i, took, bad[i].took);
  }
  /* a forced function: the other tool's name is refused */
  CHECK_EQ_INT(22, (long long)feed(TOOL_FORMAT_HERMES, now, "<tool_call>\n{\"name\": \"get", &fin));
  /* not done before the end */
  feed(TOOL_FORMAT_HERMES, req, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_cal",
       &fin);
  CHECK(!fin);
  /* line format: CALL name args, up to the newline */
  CHECK_EQ_INT(28, (long long)feed(TOOL_FORMAT_LINE, req, "CALL get_weather Oslo 3 yes\n", &fin));
  CHECK(fin);
  CHECK_EQ_INT(9, (long long)feed(TOOL_FORMAT_LINE, now, "CALL now\n", &fin));
  CHECK(fin);
  CHECK_EQ_INT(5, (long long)feed(TOOL_FORMAT_LINE, now, "CALL get_weather\n", &fin));
  CHECK_EQ_INT(8, (long long)feed(TOOL_FORMAT_LINE, now, "CALL now 1\n", &fin)); /* no params */
}

static const test_case tests[] = {
    {"reads tools and tool_choice, and refuses bad ones naming the field", test_reads_tools_and_choice},
    {"parses hermes calls out of text (parallel or not; non-calls stay text)", test_parses_hermes_calls},
    {"parses line calls with arguments typed by the schema", test_parses_line_calls},
    {"renders earlier assistant calls in both formats", test_renders_earlier_calls},
    {"the forced-call automaton takes well-formed calls and refuses the first bad byte", test_forced_call_automaton},
    {NULL, NULL},
};

int main(int argc, char **argv) { return check_main(argc, argv, tests); }
