/*
 * ferry-brokerd: will mount for unprivileged peers and register FUSE
 * passthrough backing files for them (issue "ferry-brokerd"). Until then it
 * refuses to run, saying so; root can mount with `ferry mount` directly.
 */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		printf("usage: ferry-brokerd --socket PATH --policy FILE\n\n"
		       "Not functional yet: mount as root with `ferry mount`.\n");
		return 0;
	}
	fprintf(stderr, "ferry-brokerd: not functional yet: mount as root with `ferry mount`\n");
	return 1;
}
