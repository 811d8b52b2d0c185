// attnres: one binary, subcommands train | eval | generate | tokenize | inspect.
#include <cstdio>
int main() { std::puts("attnres: under construction"); return 0; }
