/*
 * ferry-reconciler: will take closed staging files from ferry-mountd and
 * ferry them into the object store (issue "Write passthrough and the
 * reconciler process"). Until then ferry-mountd commits writes itself and
 * this program refuses to run, saying so.
 */
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
	if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		printf("usage: ferry-reconciler [options]\n\n"
		       "Not functional yet: ferry-mountd uploads and commits writes itself.\n");
		return 0;
	}
	fprintf(stderr, "ferry-reconciler: not functional yet: ferry-mountd uploads and commits "
			"writes itself in this version\n");
	return 1;
}
