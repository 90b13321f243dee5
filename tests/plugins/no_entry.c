/* A shared object without the entry symbol: must be refused with the symbol named. */
__attribute__((visibility("default"))) int not_the_entry(void) { return 42; }
