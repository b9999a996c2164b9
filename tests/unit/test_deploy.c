/*
 * deploy/: the Kubernetes manifests and the systemd unit say what the broker
 * and the workloads may do, so the fields that matter are checked here rather
 * than by eye. Every YAML document in deploy/k8s (its .yaml and .yml files)
 * is parsed with libyaml into a small tree; then:
 *   - the broker DaemonSet adds exactly the capabilities the broker keeps
 *     (SYS_ADMIN; SETUID and SETGID for its fsuid switch) and drops ALL,
 *     mounts the policy root with Bidirectional propagation from a hostPath
 *     of the same path, has hostPaths for /run/ferryfs and /dev/fuse, and its
 *     readiness and liveness probes run `ferry-brokerd --ping` on the socket
 *     its args serve;
 *   - the API server's own rules hold: Bidirectional only in a privileged
 *     container, allowPrivilegeEscalation: false never with privileged or an
 *     added SYS_ADMIN, command/args items are strings;
 *   - the ConfigMap's policy parses with the broker's own parser, its root is
 *     the DaemonSet's mount root, and it admits the workload's uid/gid;
 *   - the workload mounts through the same socket, beneath the root, sees the
 *     root with HostToContainer, runs `ferry umount` on the same mountpoint in
 *     its preStop hook, allows the drain time for it, and runs every container
 *     as non-root without privilege escalation or capabilities;
 *   - the systemd unit bounds the broker to those same capabilities with
 *     no_new_privs and uses no setting that would put it in a mount namespace
 *     of its own.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "policy.h"

#define K8S_DIR FERRY_SOURCE_DIR "/deploy/k8s"
#define UNIT_FILE FERRY_SOURCE_DIR "/deploy/systemd/ferry-brokerd.service"
#define DOCKERFILE FERRY_SOURCE_DIR "/deploy/Dockerfile"
#define MAX_DEPTH 64

/* The capabilities ferry-brokerd keeps (brokerd/privs.c): CAP_SYS_ADMIN for
 * mounts and the FUSE backing ioctls, CAP_SETUID and CAP_SETGID (permitted
 * only) to switch its fsuid/fsgid to a peer's; it refuses to start without
 * them. The DaemonSet adds exactly these and the unit bounds it to them. */
static const char *const broker_caps[] = { "SYS_ADMIN", "SETUID", "SETGID" };
#define N_BROKER_CAPS (sizeof(broker_caps) / sizeof(*broker_caps))

/* ------------------------------------------------------------------ tree -- */

enum ykind { Y_SCALAR, Y_SEQ, Y_MAP };

struct ynode {
	enum ykind kind;
	char *str;           /* Y_SCALAR */
	bool plain;          /* a scalar written without quotes */
	size_t n;            /* items (Y_SEQ) or pairs (Y_MAP) */
	char **keys;         /* Y_MAP */
	struct ynode **kids; /* Y_SEQ items, Y_MAP values */
	size_t line;         /* 1-based, for messages */
};

struct ydoc {
	char file[64];
	int index; /* 0-based within its file */
	struct ynode *root;
};

struct yset {
	struct ydoc *docs;
	size_t n;
};

static void ynode_free(struct ynode *y)
{
	if (!y)
		return;
	free(y->str);
	for (size_t i = 0; i < y->n; i++) {
		if (y->keys)
			free(y->keys[i]);
		ynode_free(y->kids[i]);
	}
	free(y->keys);
	free(y->kids);
	free(y);
}

static void yset_free(struct yset *s)
{
	for (size_t i = 0; i < s->n; i++)
		ynode_free(s->docs[i].root);
	free(s->docs);
	s->docs = NULL;
	s->n = 0;
}

/* Copies node id of d into a tree; duplicate mapping keys (which the API
 * server's decoder refuses) and non-scalar keys are errors. */
static struct ynode *convert(yaml_document_t *d, int id, int depth, char *err, size_t errlen)
{
	yaml_node_t *src = yaml_document_get_node(d, id);
	struct ynode *y;

	if (!src || depth > MAX_DEPTH) {
		snprintf(err, errlen, "node %d: %s", id, src ? "nested too deep" : "missing");
		return NULL;
	}
	y = calloc(1, sizeof(*y));
	cr_assert_not_null(y);
	y->line = src->start_mark.line + 1;
	switch (src->type) {
	case YAML_SCALAR_NODE:
		y->kind = Y_SCALAR;
		y->str = strndup((const char *)src->data.scalar.value, src->data.scalar.length);
		cr_assert_not_null(y->str);
		y->plain = src->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
		return y;
	case YAML_SEQUENCE_NODE: {
		yaml_node_item_t *it = src->data.sequence.items.start;
		size_t n = (size_t)(src->data.sequence.items.top - it);
		y->kind = Y_SEQ;
		y->kids = calloc(n ? n : 1, sizeof(*y->kids));
		cr_assert_not_null(y->kids);
		for (size_t i = 0; i < n; i++) {
			y->kids[i] = convert(d, it[i], depth + 1, err, errlen);
			if (!y->kids[i])
				goto fail;
			y->n++;
		}
		return y;
	}
	case YAML_MAPPING_NODE: {
		yaml_node_pair_t *pr = src->data.mapping.pairs.start;
		size_t n = (size_t)(src->data.mapping.pairs.top - pr);
		y->kind = Y_MAP;
		y->kids = calloc(n ? n : 1, sizeof(*y->kids));
		y->keys = calloc(n ? n : 1, sizeof(*y->keys));
		cr_assert(y->kids && y->keys);
		for (size_t i = 0; i < n; i++) {
			yaml_node_t *k = yaml_document_get_node(d, pr[i].key);
			if (!k || k->type != YAML_SCALAR_NODE) {
				snprintf(err, errlen, "line %zu: a mapping key that is not a scalar",
					 y->line);
				goto fail;
			}
			char *key = strndup((const char *)k->data.scalar.value, k->data.scalar.length);
			cr_assert_not_null(key);
			for (size_t j = 0; j < y->n; j++) {
				if (strcmp(y->keys[j], key) == 0) {
					snprintf(err, errlen, "line %zu: duplicate key \"%s\"",
						 (size_t)k->start_mark.line + 1, key);
					free(key);
					goto fail;
				}
			}
			y->kids[i] = convert(d, pr[i].value, depth + 1, err, errlen);
			if (!y->kids[i]) {
				free(key);
				goto fail;
			}
			y->keys[i] = key;
			y->n++;
		}
		return y;
	}
	default:
		snprintf(err, errlen, "line %zu: an empty node", y->line);
		break;
	}
fail:
	ynode_free(y);
	return NULL;
}

/* Appends every document of path to set. */
static int load_file(const char *path, const char *name, struct yset *set, char *err,
		     size_t errlen)
{
	yaml_parser_t p;
	FILE *f = fopen(path, "r");
	int index = 0, rc = 0;

	if (!f) {
		snprintf(err, errlen, "%.300s: %s", path, strerror(errno));
		return -1;
	}
	cr_assert(yaml_parser_initialize(&p));
	yaml_parser_set_input_file(&p, f);
	for (;;) {
		yaml_document_t d;
		yaml_node_t *root;

		if (!yaml_parser_load(&p, &d)) {
			snprintf(err, errlen, "%s:%zu: %s %s", name, (size_t)p.problem_mark.line + 1,
				 p.problem ? p.problem : "parse error",
				 p.context ? p.context : "");
			rc = -1;
			break;
		}
		root = yaml_document_get_root_node(&d);
		if (!root) { /* end of the stream */
			yaml_document_delete(&d);
			break;
		}
		char cerr[256] = "";
		struct ynode *y = convert(&d, 1, 0, cerr, sizeof(cerr));
		yaml_document_delete(&d);
		if (!y) {
			snprintf(err, errlen, "%s, document %d: %s", name, index + 1, cerr);
			rc = -1;
			break;
		}
		struct ydoc *docs = realloc(set->docs, (set->n + 1) * sizeof(*docs));
		cr_assert_not_null(docs);
		set->docs = docs;
		snprintf(docs[set->n].file, sizeof(docs[set->n].file), "%s", name);
		docs[set->n].index = index++;
		docs[set->n].root = y;
		set->n++;
	}
	yaml_parser_delete(&p);
	fclose(f);
	return rc;
}

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);
	return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* Every .yaml and .yml file of deploy/k8s, in name order. Returns the file
 * count; on a file that does not parse, the error is in err. */
static size_t load_k8s(struct yset *set, char *err, size_t errlen)
{
	DIR *dir = opendir(K8S_DIR);
	struct dirent *e;
	char *names[64];
	size_t n = 0;

	if (!dir) {
		snprintf(err, errlen, "cannot open %s: %s", K8S_DIR, strerror(errno));
		return 0;
	}
	while ((e = readdir(dir))) {
		if (e->d_name[0] == '.' || !(ends_with(e->d_name, ".yaml") || ends_with(e->d_name, ".yml")))
			continue;
		cr_assert(n < 64, "too many files in %s", K8S_DIR);
		names[n] = strdup(e->d_name);
		cr_assert_not_null(names[n]);
		n++;
	}
	closedir(dir);
	qsort(names, n, sizeof(*names), cmp_names);
	for (size_t i = 0; i < n; i++) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/%s", K8S_DIR, names[i]);
		if (!*err && load_file(path, names[i], set, err, errlen) < 0 && !*err)
			snprintf(err, errlen, "%s: cannot load", names[i]);
		free(names[i]);
	}
	return n;
}

/* ------------------------------------------------------------- access -- */

static struct ynode *yget(const struct ynode *y, const char *key)
{
	if (!y || y->kind != Y_MAP)
		return NULL;
	for (size_t i = 0; i < y->n; i++)
		if (strcmp(y->keys[i], key) == 0)
			return y->kids[i];
	return NULL;
}

/* "a.b.c": mapping keys only (no key here has a dot in it). */
static struct ynode *ypath(const struct ynode *y, const char *path)
{
	char buf[256], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", path);
	for (char *k = strtok_r(buf, ".", &save); k && y; k = strtok_r(NULL, ".", &save))
		y = yget(y, k);
	return (struct ynode *)y;
}

static const char *ystr(const struct ynode *y)
{
	return y && y->kind == Y_SCALAR ? y->str : NULL;
}

static const char *ypath_str(const struct ynode *y, const char *path)
{
	return ystr(ypath(y, path));
}

static size_t yseq_len(const struct ynode *y)
{
	return y && y->kind == Y_SEQ ? y->n : 0;
}

static bool yseq_has(const struct ynode *y, const char *s)
{
	for (size_t i = 0; i < yseq_len(y); i++)
		if (ystr(y->kids[i]) && strcmp(y->kids[i]->str, s) == 0)
			return true;
	return false;
}

/* A boolean field: 1 true, 0 false, -1 absent. */
static int ybool(const struct ynode *y, const char *path)
{
	const char *s = ypath_str(y, path);

	if (!s)
		return -1;
	if (!strcmp(s, "true"))
		return 1;
	if (!strcmp(s, "false"))
		return 0;
	cr_assert_fail("%s: \"%s\" is not true or false", path, s);
	return -1;
}

static long ylong(const struct ynode *y, const char *path, long absent)
{
	const char *s = ypath_str(y, path);
	char *end;
	long v;

	if (!s)
		return absent;
	errno = 0;
	v = strtol(s, &end, 10);
	cr_assert(!errno && *s && !*end, "%s: \"%s\" is not a number", path, s);
	return v;
}

static void require_manifests(void);

static const struct ydoc *find_doc(const struct yset *set, const char *kind, const char *name)
{
	const struct ydoc *found = NULL;

	require_manifests();

	for (size_t i = 0; i < set->n; i++) {
		const char *k = ypath_str(set->docs[i].root, "kind");
		const char *nm = ypath_str(set->docs[i].root, "metadata.name");
		if (k && nm && !strcmp(k, kind) && (!name || !strcmp(nm, name))) {
			cr_assert_null(found, "more than one %s%s%s", kind, name ? " " : "",
				       name ? name : "");
			found = &set->docs[i];
		}
	}
	cr_assert_not_null(found, "no %s%s%s in %s", kind, name ? " " : "", name ? name : "",
			   K8S_DIR);
	return found;
}

/* The pod spec of a Pod or of a workload's template. */
static const struct ynode *pod_spec(const struct ydoc *d)
{
	const char *kind = ypath_str(d->root, "kind");
	const struct ynode *s = !strcmp(kind, "Pod") ? ypath(d->root, "spec")
						     : ypath(d->root, "spec.template.spec");
	cr_assert_not_null(s, "%s: %s has no pod spec", d->file, kind);
	return s;
}

/* Containers and init containers together, init containers first. */
static size_t all_containers(const struct ynode *spec, const struct ynode **out, size_t max)
{
	size_t n = 0;
	const char *lists[] = { "initContainers", "containers" };

	for (size_t l = 0; l < 2; l++) {
		const struct ynode *seq = yget(spec, lists[l]);
		for (size_t i = 0; i < yseq_len(seq); i++) {
			cr_assert(n < max);
			out[n++] = seq->kids[i];
		}
	}
	return n;
}

static const struct ynode *find_container(const struct ynode *spec, const char *name)
{
	const struct ynode *c[32];
	size_t n = all_containers(spec, c, 32);

	for (size_t i = 0; i < n; i++)
		if (ypath_str(c[i], "name") && !strcmp(ypath_str(c[i], "name"), name))
			return c[i];
	cr_assert_fail("no container %s", name);
	return NULL;
}

static const struct ynode *find_volume(const struct ynode *spec, const char *name)
{
	const struct ynode *vols = yget(spec, "volumes");

	cr_assert_not_null(name, "a volumeMount without a name");
	for (size_t i = 0; i < yseq_len(vols); i++)
		if (ypath_str(vols->kids[i], "name") && !strcmp(ypath_str(vols->kids[i], "name"), name))
			return vols->kids[i];
	cr_assert_fail("no volume %s", name);
	return NULL;
}

/* The container's volumeMount at mountPath, or NULL. */
static const struct ynode *mount_at(const struct ynode *c, const char *mount_path)
{
	const struct ynode *vm = yget(c, "volumeMounts");

	for (size_t i = 0; i < yseq_len(vm); i++)
		if (ypath_str(vm->kids[i], "mountPath") &&
		    !strcmp(ypath_str(vm->kids[i], "mountPath"), mount_path))
			return vm->kids[i];
	return NULL;
}

/* command then args, as one argv (pointers into the tree). */
static size_t container_argv(const struct ynode *c, const char **argv, size_t max)
{
	size_t n = 0;
	const char *lists[] = { "command", "args" };

	for (size_t l = 0; l < 2; l++) {
		const struct ynode *seq = yget(c, lists[l]);
		for (size_t i = 0; i < yseq_len(seq); i++) {
			cr_assert(n + 1 < max);
			cr_assert_not_null(ystr(seq->kids[i]), "%s: a %s item that is not a string",
					   ypath_str(c, "name"), lists[l]);
			argv[n++] = seq->kids[i]->str;
		}
	}
	argv[n] = NULL;
	return n;
}

/* The value of --opt in argv ("--opt V" or "--opt=V"), or NULL. */
static const char *opt_value(const char **argv, size_t argc, const char *opt)
{
	size_t len = strlen(opt);

	for (size_t i = 0; i < argc; i++) {
		if (!strcmp(argv[i], opt))
			return i + 1 < argc ? argv[i + 1] : NULL;
		if (!strncmp(argv[i], opt, len) && argv[i][len] == '=')
			return argv[i] + len + 1;
	}
	return NULL;
}

static bool is_program(const char *word, const char *prog)
{
	const char *slash = strrchr(word, '/');
	return !strcmp(slash ? slash + 1 : word, prog);
}

static bool beneath(const char *path, const char *root)
{
	size_t n = strlen(root);
	return !strncmp(path, root, n) && path[n] == '/' && path[n + 1] != '\0';
}

static void dir_of(const char *path, char *out, size_t outlen)
{
	const char *slash = strrchr(path, '/');
	cr_assert(slash && slash != path, "%s has no directory", path);
	snprintf(out, outlen, "%.*s", (int)(slash - path), path);
}

/* Splits a shell command line (as a preStop hook's `sh -c` script) into
 * words at blanks, newlines and ; & | ( ) < >. No quoting: the scripts here
 * quote nothing that matters. Returns the word count; frees with free(buf). */
static size_t shell_words(const char *script, char **buf, const char **words, size_t max)
{
	size_t n = 0;
	char *save = NULL;

	*buf = strdup(script);
	cr_assert_not_null(*buf);
	for (char *w = strtok_r(*buf, " \t\n;&|()<>", &save); w;
	     w = strtok_r(NULL, " \t\n;&|()<>", &save)) {
		cr_assert(n < max);
		words[n++] = w;
	}
	return n;
}

/* ------------------------------------------------------------- fixture -- */

static struct yset set;
static size_t nfiles;
static char load_err[1024];

/* Loads every manifest; a parse error fails each test with its message. */
static void setup(void)
{
	load_err[0] = '\0';
	nfiles = load_k8s(&set, load_err, sizeof(load_err));
}

static void require_manifests(void)
{
	cr_assert(!load_err[0], "%s", load_err);
}

static void teardown(void)
{
	yset_free(&set);
}

TestSuite(deploy, .init = setup, .fini = teardown);

/* The DaemonSet's broker: its container and the paths its args name. */
struct broker {
	const struct ynode *spec, *c;
	const char *socket;     /* --socket */
	const char *mount_root; /* mountPath of the Bidirectional mount */
};

static struct broker get_broker(void)
{
	struct broker b = { 0 };
	const char *argv[64];
	size_t argc;
	const struct ynode *vm;

	b.spec = pod_spec(find_doc(&set, "DaemonSet", "ferry-brokerd"));
	b.c = find_container(b.spec, "ferry-brokerd");
	argc = container_argv(b.c, argv, 64);
	cr_assert(argc > 0 && is_program(argv[0], "ferry-brokerd"),
		  "the broker container does not run ferry-brokerd");
	b.socket = opt_value(argv, argc, "--socket");
	cr_assert_not_null(b.socket, "the broker's args have no --socket");
	const char *policy = opt_value(argv, argc, "--policy");
	char policy_dir[1024];
	cr_assert_not_null(policy, "the broker's args have no --policy");
	dir_of(policy, policy_dir, sizeof(policy_dir));
	const struct ynode *pvm = mount_at(b.c, policy_dir);
	cr_assert_not_null(pvm, "the broker does not mount anything at %s (its --policy)", policy_dir);
	cr_assert_not_null(ypath_str(find_volume(b.spec, ypath_str(pvm, "name")), "configMap.name"),
			   "%s is not a ConfigMap volume", policy_dir);
	vm = yget(b.c, "volumeMounts");
	for (size_t i = 0; i < yseq_len(vm); i++)
		if (ypath_str(vm->kids[i], "mountPropagation") &&
		    !strcmp(ypath_str(vm->kids[i], "mountPropagation"), "Bidirectional")) {
			cr_assert_null(b.mount_root, "more than one Bidirectional mount in the broker");
			b.mount_root = ypath_str(vm->kids[i], "mountPath");
		}
	cr_assert_not_null(b.mount_root, "the broker has no Bidirectional volumeMount");
	return b;
}

/* The workload pod's mount container: the one whose argv is `ferry mount`. */
struct workload {
	const struct ynode *spec, *mount_c;
	const char *argv[64];
	size_t argc;
	const char *mountpoint, *broker_socket;
};

static void get_workload(struct workload *w)
{
	const struct ynode *c[32];
	size_t n;

	memset(w, 0, sizeof(*w));
	w->spec = pod_spec(find_doc(&set, "Pod", NULL));
	n = all_containers(w->spec, c, 32);
	for (size_t i = 0; i < n; i++) {
		const char *argv[64];
		size_t argc = container_argv(c[i], argv, 64);
		if (argc >= 2 && is_program(argv[0], "ferry") && !strcmp(argv[1], "mount")) {
			cr_assert_null(w->mount_c, "more than one container runs `ferry mount`");
			w->mount_c = c[i];
			memcpy(w->argv, argv, sizeof(argv));
			w->argc = argc;
		}
	}
	cr_assert_not_null(w->mount_c, "no container of the workload pod runs `ferry mount`");
	/* ferry mount [options] VOLUME MOUNTPOINT */
	w->mountpoint = w->argv[w->argc - 1];
	w->broker_socket = opt_value(w->argv, w->argc, "--broker");
}

/* --------------------------------------------------------------- tests -- */

Test(deploy, every_manifest_parses)
{
	require_manifests();
	cr_assert_geq(nfiles, 2, "expected the DaemonSet and the workload files in %s", K8S_DIR);
	for (size_t i = 0; i < set.n; i++) {
		const struct ydoc *d = &set.docs[i];
		cr_assert_eq(d->root->kind, Y_MAP, "%s, document %d: not a mapping", d->file,
			     d->index + 1);
		cr_assert_not_null(ypath_str(d->root, "apiVersion"), "%s, document %d: no apiVersion",
				   d->file, d->index + 1);
		cr_assert_not_null(ypath_str(d->root, "kind"), "%s, document %d: no kind", d->file,
				   d->index + 1);
		cr_assert_not_null(ypath_str(d->root, "metadata.name"),
				   "%s, document %d: no metadata.name", d->file, d->index + 1);
	}
}

/* Rules the API server enforces whatever the manifest's author thought. */
Test(deploy, api_server_would_accept_the_security_contexts)
{
	require_manifests();
	for (size_t i = 0; i < set.n; i++) {
		const char *kind = ypath_str(set.docs[i].root, "kind");
		const struct ynode *c[32];
		size_t n;

		if (strcmp(kind, "Pod") && strcmp(kind, "DaemonSet"))
			continue;
		n = all_containers(pod_spec(&set.docs[i]), c, 32);
		for (size_t j = 0; j < n; j++) {
			const char *name = ypath_str(c[j], "name");
			const struct ynode *sc = yget(c[j], "securityContext");
			const struct ynode *vm = yget(c[j], "volumeMounts");
			bool privileged = ybool(sc, "privileged") == 1;
			bool no_escalation = ybool(sc, "allowPrivilegeEscalation") == 0;
			const struct ynode *add = ypath(sc, "capabilities.add");

			/* pkg/apis/core/validation: validateMountPropagation */
			for (size_t k = 0; k < yseq_len(vm); k++) {
				const char *prop = ypath_str(vm->kids[k], "mountPropagation");
				if (prop && !strcmp(prop, "Bidirectional"))
					cr_assert(privileged,
						  "%s: Bidirectional propagation in container %s, which is "
						  "not privileged: the API server refuses it",
						  set.docs[i].file, name);
				if (prop)
					cr_assert(!strcmp(prop, "None") || !strcmp(prop, "HostToContainer") ||
						  !strcmp(prop, "Bidirectional"),
						  "%s: container %s: unknown mountPropagation %s",
						  set.docs[i].file, name, prop);
			}
			/* ValidateSecurityContext */
			cr_assert(!(no_escalation && privileged),
				  "%s: container %s: allowPrivilegeEscalation false with privileged",
				  set.docs[i].file, name);
			cr_assert(!(no_escalation && (yseq_has(add, "SYS_ADMIN") || yseq_has(add, "CAP_SYS_ADMIN"))),
				  "%s: container %s: allowPrivilegeEscalation false with SYS_ADMIN added",
				  set.docs[i].file, name);
			/* command, args and exec probe/hook commands are []string: an
			 * unquoted 0660 or true would be decoded as a number or a bool. */
			const char *lists[] = { "command", "args", "readinessProbe.exec.command",
						"livenessProbe.exec.command", "startupProbe.exec.command",
						"lifecycle.preStop.exec.command" };
			for (size_t l = 0; l < sizeof(lists) / sizeof(*lists); l++) {
				const struct ynode *seq = ypath(c[j], lists[l]);
				for (size_t k = 0; k < yseq_len(seq); k++) {
					const struct ynode *it = seq->kids[k];
					cr_assert_eq(it->kind, Y_SCALAR, "%s: %s.%s: not a string",
						     set.docs[i].file, name, lists[l]);
					if (!it->plain)
						continue;
					const char *s = it->str;
					const char *digits = s + (*s == '-' || *s == '+');
					/* 0660, 1.5, 1_000: YAML 1.1 numbers */
					bool numeric = *digits >= '0' && *digits <= '9' &&
						       strspn(digits, "0123456789._") == strlen(digits);
					const char *words[] = { "true", "false", "yes", "no", "on", "off",
								"null", "~", "" };
					for (size_t w = 0; w < sizeof(words) / sizeof(*words); w++)
						cr_assert(strcasecmp(s, words[w]) != 0,
							  "%s: %s.%s: unquoted \"%s\" is not a string",
							  set.docs[i].file, name, lists[l], s);
					cr_assert(!numeric, "%s: %s.%s: unquoted %s is a number, not a string",
						  set.docs[i].file, name, lists[l], s);
				}
			}
		}
	}
}

Test(deploy, daemonset_capabilities)
{
	struct broker b = get_broker();
	const struct ynode *add = ypath(b.c, "securityContext.capabilities.add");
	const struct ynode *drop = ypath(b.c, "securityContext.capabilities.drop");

	cr_assert_eq(yseq_len(add), N_BROKER_CAPS,
		     "the broker must add exactly SYS_ADMIN, SETUID and SETGID (%zu listed)",
		     yseq_len(add));
	for (size_t i = 0; i < N_BROKER_CAPS; i++)
		cr_assert(yseq_has(add, broker_caps[i]), "the broker does not add %s", broker_caps[i]);
	cr_assert(yseq_has(drop, "ALL"), "the broker must drop ALL other capabilities");
}

Test(deploy, daemonset_hostpaths_and_propagation)
{
	struct broker b = get_broker();
	const struct ynode *vm = yget(b.c, "volumeMounts");
	char sockdir[1024];
	bool root_seen = false, sock_seen = false, fuse_seen = false;

	dir_of(b.socket, sockdir, sizeof(sockdir));
	cr_assert_str_eq(sockdir, "/run/ferryfs");
	for (size_t i = 0; i < yseq_len(vm); i++) {
		const char *path = ypath_str(vm->kids[i], "mountPath");
		const char *prop = ypath_str(vm->kids[i], "mountPropagation");
		const struct ynode *vol = find_volume(b.spec, ypath_str(vm->kids[i], "name"));
		const char *host = ypath_str(vol, "hostPath.path");

		if (!strcmp(path, b.mount_root)) {
			/* The same path on the host and in the container: the
			 * policy root means one directory everywhere. */
			cr_assert_not_null(host, "the mount root is not a hostPath volume");
			cr_assert_str_eq(host, b.mount_root);
			cr_assert_str_eq(prop, "Bidirectional");
			root_seen = true;
		} else if (!strcmp(path, sockdir)) {
			cr_assert_not_null(host, "the socket directory is not a hostPath volume");
			cr_assert_str_eq(host, "/run/ferryfs");
			sock_seen = true;
		} else if (!strcmp(path, "/dev/fuse")) {
			cr_assert_str_eq(host, "/dev/fuse");
			cr_assert_str_eq(ypath_str(vol, "hostPath.type"), "CharDevice");
			fuse_seen = true;
		}
	}
	cr_assert(root_seen && sock_seen && fuse_seen,
		  "the broker needs hostPath mounts of the mount root, %s and /dev/fuse", sockdir);
}

Test(deploy, daemonset_probes_ping_the_served_socket)
{
	struct broker b = get_broker();
	const char *probes[] = { "readinessProbe", "livenessProbe" };

	for (size_t p = 0; p < 2; p++) {
		const struct ynode *cmd = ypath(yget(b.c, probes[p]), "exec.command");
		const char *argv[16];
		size_t argc = 0;

		cr_assert_not_null(cmd, "the broker has no exec %s", probes[p]);
		for (size_t i = 0; i < yseq_len(cmd) && argc < 15; i++)
			argv[argc++] = ystr(cmd->kids[i]);
		cr_assert(argc >= 1 && is_program(argv[0], "ferry-brokerd"), "%s does not run ferry-brokerd",
			  probes[p]);
		bool ping = false;
		for (size_t i = 1; i < argc; i++)
			ping |= !strcmp(argv[i], "--ping");
		cr_assert(ping, "%s does not run ferry-brokerd --ping", probes[p]);
		const char *sock = opt_value(argv, argc, "--socket");
		cr_assert_not_null(sock, "%s names no --socket", probes[p]);
		cr_assert_str_eq(sock, b.socket, "%s pings %s, the broker serves %s", probes[p], sock,
				 b.socket);
	}
}

Test(deploy, policy_parses_and_matches_the_mount_root)
{
	struct broker b = get_broker();
	const struct ydoc *cm = find_doc(&set, "ConfigMap", "ferry-brokerd-policy");
	const struct ynode *data = yget(cm->root, "data");
	const struct ynode *vols = yget(b.spec, "volumes");
	const char *text = NULL;
	struct policy *pol = NULL;
	char err[512] = "";
	struct workload w;

	/* The ConfigMap is mounted as the directory of --policy. */
	bool mounted = false;
	for (size_t i = 0; i < yseq_len(vols); i++)
		mounted |= ypath_str(vols->kids[i], "configMap.name") &&
			   !strcmp(ypath_str(vols->kids[i], "configMap.name"), "ferry-brokerd-policy");
	cr_assert(mounted, "the DaemonSet does not mount the policy ConfigMap");
	cr_assert(data && data->kind == Y_MAP && data->n == 1, "the ConfigMap holds one policy file");
	text = ystr(data->kids[0]);
	cr_assert_not_null(text);

	cr_assert_eq(policy_parse(text, strlen(text), data->keys[0], &pol, err, sizeof(err)), 0, "%s",
		     err);
	cr_assert_geq(pol->n, 1, "the policy allows nobody");
	for (size_t i = 0; i < pol->n; i++)
		cr_assert_str_eq(pol->rules[i].root, b.mount_root,
				 "policy line %u: root %s is not the DaemonSet's mount root",
				 pol->rules[i].line, pol->rules[i].root);

	/* ...and it lets the example workload in, beneath that root. */
	get_workload(&w);
	const struct ynode *psc = yget(w.spec, "securityContext");
	const struct ynode *csc = yget(w.mount_c, "securityContext");
	long uid = ylong(csc, "runAsUser", ylong(psc, "runAsUser", -1));
	long gid = ylong(csc, "runAsGroup", ylong(psc, "runAsGroup", -1));
	cr_assert(uid > 0 && gid > 0, "the mount container has no non-root runAsUser/runAsGroup");
	const struct policy_rule *r = policy_match(pol, (uid_t)uid, (gid_t)gid, NULL);
	cr_assert_not_null(r, "no policy line admits uid %ld gid %ld", uid, gid);
	cr_assert(beneath(w.mountpoint, r->root), "mountpoint %s is not beneath the policy root %s",
		  w.mountpoint, r->root);
	policy_free(pol);
}

Test(deploy, workload_mounts_through_the_broker_and_unmounts_in_prestop)
{
	struct broker b = get_broker();
	const struct ydoc *pod = find_doc(&set, "Pod", NULL);
	struct workload w;
	char sockdir[1024], *buf = NULL;
	const char *words[256];
	size_t nw;
	const struct ynode *hook;
	const char *umount_mp = NULL;
	long timeout = -1;

	get_workload(&w);
	cr_assert_not_null(w.broker_socket, "`ferry mount` has no --broker");
	cr_assert_str_eq(w.broker_socket, b.socket);
	bool fg = false;
	for (size_t i = 2; i < w.argc; i++)
		fg |= !strcmp(w.argv[i], "-f") || !strcmp(w.argv[i], "--foreground");
	cr_assert(fg, "`ferry mount` must stay in the foreground (-f) as the container's process");
	cr_assert(beneath(w.mountpoint, b.mount_root), "mountpoint %s is not beneath %s",
		  w.mountpoint, b.mount_root);
	cr_assert_not_null(opt_value(w.argv, w.argc, "--staging-dir"), "`ferry mount` has no --staging-dir");

	/* The socket: the broker's host directory, at the same path. */
	dir_of(b.socket, sockdir, sizeof(sockdir));
	const struct ynode *svm = mount_at(w.mount_c, sockdir);
	cr_assert_not_null(svm, "the mount container does not mount %s", sockdir);
	cr_assert_str_eq(ypath_str(find_volume(w.spec, ypath_str(svm, "name")), "hostPath.path"),
			 sockdir);

	/* The staging directory is an emptyDir. */
	const struct ynode *stvm = mount_at(w.mount_c, opt_value(w.argv, w.argc, "--staging-dir"));
	cr_assert_not_null(stvm, "the staging directory is not a volume of the mount container");
	cr_assert_not_null(yget(find_volume(w.spec, ypath_str(stvm, "name")), "emptyDir"),
			   "the staging directory is not an emptyDir");

	/* preStop: `ferry umount [--timeout N] MOUNTPOINT`, directly or in a
	 * shell script. */
	hook = ypath(w.mount_c, "lifecycle.preStop.exec.command");
	cr_assert(yseq_len(hook) > 0, "the mount container has no exec preStop hook");
	{
		size_t len = 1;
		for (size_t i = 0; i < hook->n; i++)
			len += strlen(ystr(hook->kids[i])) + 1;
		char *joined = calloc(1, len);
		cr_assert_not_null(joined);
		for (size_t i = 0; i < hook->n; i++) {
			strcat(joined, ystr(hook->kids[i]));
			strcat(joined, " ");
		}
		nw = shell_words(joined, &buf, words, 256);
		free(joined);
	}
	for (size_t i = 0; i + 1 < nw; i++) {
		if (!is_program(words[i], "ferry") || strcmp(words[i + 1], "umount"))
			continue;
		for (size_t j = i + 2; j < nw; j++) {
			if (!strcmp(words[j], "--timeout") && j + 1 < nw) {
				timeout = strtol(words[++j], NULL, 10);
				continue;
			}
			if (!strncmp(words[j], "--timeout=", 10)) {
				timeout = strtol(words[j] + 10, NULL, 10);
				continue;
			}
			if (words[j][0] == '-')
				continue;
			umount_mp = words[j];
			break;
		}
		break;
	}
	cr_assert_not_null(umount_mp, "the preStop hook does not run `ferry umount MOUNTPOINT`");
	cr_assert_str_eq(umount_mp, w.mountpoint, "preStop unmounts %s, the mount is at %s", umount_mp,
			 w.mountpoint);

	/* The drain must fit in the grace period. */
	long grace = ylong(pod->root, "spec.terminationGracePeriodSeconds", 30);
	cr_assert_geq(grace, 120, "terminationGracePeriodSeconds %ld leaves no time for a drain",
		      grace);
	if (timeout >= 0)
		cr_assert_lt(timeout, grace,
			     "ferry umount --timeout %ld does not fit in the %ld s grace period",
			     timeout, grace);
	free(buf);
}

Test(deploy, workload_sees_the_root_with_host_to_container)
{
	struct broker b = get_broker();
	struct workload w;
	const struct ynode *c[32];
	size_t n, users = 0;
	bool app_seen = false;

	get_workload(&w);
	n = all_containers(w.spec, c, 32);
	for (size_t i = 0; i < n; i++) {
		const struct ynode *vm = yget(c[i], "volumeMounts");
		for (size_t k = 0; k < yseq_len(vm); k++) {
			const struct ynode *vol = find_volume(w.spec, ypath_str(vm->kids[k], "name"));
			const char *host = ypath_str(vol, "hostPath.path");
			if (!host || strcmp(host, b.mount_root))
				continue;
			/* Same path as on the host, and mounts made there later
			 * (by the broker) must show up. */
			cr_assert_str_eq(ypath_str(vm->kids[k], "mountPath"), b.mount_root);
			cr_assert_str_eq(ypath_str(vm->kids[k], "mountPropagation"), "HostToContainer",
					 "container %s sees the policy root without HostToContainer",
					 ypath_str(c[i], "name"));
			users++;
			app_seen |= c[i] != w.mount_c;
		}
	}
	cr_assert_geq(users, 2, "the mount container and the app must both see the policy root");
	cr_assert(app_seen, "no app container sees the mount");
}

Test(deploy, workload_containers_are_unprivileged)
{
	struct workload w;
	const struct ynode *c[32];
	size_t n;

	get_workload(&w);
	const struct ynode *psc = yget(w.spec, "securityContext");
	cr_assert_neq(ybool(w.spec, "hostPID"), 1);
	cr_assert_neq(ybool(w.spec, "hostNetwork"), 1);
	n = all_containers(w.spec, c, 32);
	cr_assert_geq(n, 2);
	for (size_t i = 0; i < n; i++) {
		const char *name = ypath_str(c[i], "name");
		const struct ynode *sc = yget(c[i], "securityContext");
		int nonroot = ybool(sc, "runAsNonRoot");
		long uid = ylong(sc, "runAsUser", ylong(psc, "runAsUser", -1));

		if (nonroot < 0)
			nonroot = ybool(psc, "runAsNonRoot");
		cr_assert_eq(nonroot, 1, "container %s: runAsNonRoot is not true", name);
		cr_assert_gt(uid, 0, "container %s: runAsUser is not a non-root uid", name);
		cr_assert_eq(ybool(sc, "allowPrivilegeEscalation"), 0,
			     "container %s: allowPrivilegeEscalation is not false", name);
		cr_assert_neq(ybool(sc, "privileged"), 1, "container %s is privileged", name);
		cr_assert(yseq_has(ypath(sc, "capabilities.drop"), "ALL"),
			  "container %s does not drop ALL capabilities", name);
		cr_assert_eq(yseq_len(ypath(sc, "capabilities.add")), 0, "container %s adds capabilities",
			     name);
	}
}

/* ------------------------------------------------------------- systemd -- */

struct unit_kv {
	char section[32], key[64], *value;
};

/* Reads a unit file into (section, key, value) triples; backslash-newline
 * continues a line, # and ; start comments. */
static size_t load_unit(const char *path, struct unit_kv *kv, size_t max)
{
	FILE *f = fopen(path, "r");
	char line[4096], logical[16384] = "", section[32] = "";
	size_t n = 0;

	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		size_t len = strcspn(line, "\n");
		bool cont;

		line[len] = '\0';
		if (!*logical && (line[0] == '#' || line[0] == ';'))
			continue;
		cont = len > 0 && line[len - 1] == '\\';
		if (cont)
			line[len - 1] = ' ';
		cr_assert_lt(strlen(logical) + strlen(line), sizeof(logical) - 1);
		strcat(logical, line);
		if (cont)
			continue;
		char *s = logical + strspn(logical, " \t");
		if (*s == '[') {
			cr_assert_not_null(strchr(s, ']'));
			snprintf(section, sizeof(section), "%.*s", (int)(strchr(s, ']') - s - 1), s + 1);
		} else if (*s) {
			char *eq = strchr(s, '=');
			cr_assert_not_null(eq, "%s: not a key=value line: %s", path, s);
			cr_assert_lt(n, max);
			snprintf(kv[n].section, sizeof(kv[n].section), "%s", section);
			snprintf(kv[n].key, sizeof(kv[n].key), "%.*s", (int)(eq - s), s);
			kv[n].value = strdup(eq + 1);
			cr_assert_not_null(kv[n].value);
			n++;
		}
		logical[0] = '\0';
	}
	fclose(f);
	return n;
}

/* The last value of key in section (systemd: later assignments win for
 * these single-valued settings), or NULL. */
static const char *unit_get(const struct unit_kv *kv, size_t n, const char *section, const char *key)
{
	const char *v = NULL;

	for (size_t i = 0; i < n; i++)
		if (!strcmp(kv[i].section, section) && !strcmp(kv[i].key, key))
			v = kv[i].value;
	return v;
}

static size_t unit_count(const struct unit_kv *kv, size_t n, const char *section, const char *key)
{
	size_t c = 0;

	for (size_t i = 0; i < n; i++)
		c += !strcmp(kv[i].section, section) && !strcmp(kv[i].key, key);
	return c;
}

Test(deploy, systemd_unit_bounds_the_broker_and_keeps_mounts_visible)
{
	struct unit_kv kv[256];
	size_t n = load_unit(UNIT_FILE, kv, 256);
	struct broker b = get_broker();
	/* Every setting that gives a unit its own mount namespace (systemd.exec(5);
	 * exec_needs_mount_namespace() in systemd's src/core/execute.c): the
	 * broker's mounts would then never reach the host. */
	const char *namespacing[] = {
		"PrivateMounts", "PrivateTmp", "PrivateDevices", "PrivateNetwork",
		"NetworkNamespacePath", "PrivateIPC", "IPCNamespacePath", "PrivatePIDs",
		"ProtectSystem", "ProtectHome", "ProtectKernelTunables", "ProtectKernelModules",
		"ProtectKernelLogs", "ProtectControlGroups", "ProtectProc", "ProcSubset",
		"ReadOnlyPaths", "ReadWritePaths", "InaccessiblePaths", "ExecPaths", "NoExecPaths",
		"ReadOnlyDirectories", "ReadWriteDirectories", "InaccessibleDirectories",
		"TemporaryFileSystem", "BindPaths", "BindReadOnlyPaths", "MountImages",
		"ExtensionImages", "ExtensionDirectories", "RootDirectory", "RootImage",
		"DynamicUser", "MountAPIVFS", "PrivateBPF", "LogNamespace",
	};

	/* CapabilityBoundingSet= is exactly the broker's set (any order, once). */
	const char *bound = unit_get(kv, n, "Service", "CapabilityBoundingSet");
	char *bbuf = NULL;
	const char *bwords[32];
	cr_assert_not_null(bound, "the unit has no CapabilityBoundingSet=");
	cr_assert_neq(bound[0], '~', "CapabilityBoundingSet= must list what is kept, not what goes");
	size_t nb = shell_words(bound, &bbuf, bwords, 32);
	cr_assert_eq(nb, N_BROKER_CAPS, "CapabilityBoundingSet=%s is not exactly the broker's set",
		     bound);
	for (size_t i = 0; i < N_BROKER_CAPS; i++) {
		char want[32];
		bool seen = false;
		snprintf(want, sizeof(want), "CAP_%s", broker_caps[i]);
		for (size_t j = 0; j < nb; j++)
			seen |= !strcmp(bwords[j], want);
		cr_assert(seen, "CapabilityBoundingSet= lacks %s", want);
	}
	free(bbuf);
	cr_assert_eq(unit_count(kv, n, "Service", "CapabilityBoundingSet"), 1,
		     "CapabilityBoundingSet= more than once: later lines add to the set");
	cr_assert_str_eq(unit_get(kv, n, "Service", "NoNewPrivileges"), "yes");
	const char *ambient = unit_get(kv, n, "Service", "AmbientCapabilities");
	cr_assert(!ambient || !*ambient, "root needs no AmbientCapabilities");
	const char *devs = unit_get(kv, n, "Service", "DeviceAllow");
	cr_assert(devs && strstr(devs, "/dev/fuse") && strstr(devs, "rw"), "DeviceAllow lacks /dev/fuse rw");
	cr_assert_str_eq(unit_get(kv, n, "Service", "Restart"), "on-failure");
	for (size_t i = 0; i < n; i++) {
		for (size_t j = 0; j < sizeof(namespacing) / sizeof(*namespacing); j++)
			cr_assert(strcmp(kv[i].key, namespacing[j]) != 0,
				  "%s= gives the broker its own mount namespace: its mounts would "
				  "not be seen on the host",
				  kv[i].key);
		cr_assert(strcmp(kv[i].key, "JoinsNamespaceOf") != 0);
		if (!strcmp(kv[i].key, "MountFlags"))
			cr_assert_str_eq(kv[i].value, "shared");
	}

	/* It serves the socket the pods use, in its RuntimeDirectory. */
	const char *exec = unit_get(kv, n, "Service", "ExecStart");
	char *buf = NULL;
	const char *words[64];
	size_t nw;
	cr_assert_not_null(exec);
	nw = shell_words(exec, &buf, words, 64);
	cr_assert(nw > 0 && is_program(words[0], "ferry-brokerd"));
	const char *sock = opt_value(words, nw, "--socket");
	cr_assert_not_null(sock, "ExecStart has no --socket");
	cr_assert_str_eq(sock, b.socket);
	char rundir[1024];
	snprintf(rundir, sizeof(rundir), "/run/%s", unit_get(kv, n, "Service", "RuntimeDirectory"));
	char sockdir[1024];
	dir_of(sock, sockdir, sizeof(sockdir));
	cr_assert_str_eq(sockdir, rundir, "the socket is not in the RuntimeDirectory");
	free(buf);
	for (size_t i = 0; i < n; i++)
		free(kv[i].value);
}

Test(deploy, dockerfile_is_trixie_with_a_non_root_user)
{
	FILE *f = fopen(DOCKERFILE, "r");
	char line[1024];
	const char *user = NULL;
	char last_user[sizeof(line)] = "";
	bool trixie = false, bin = false;

	cr_assert_not_null(f, "%s: %s", DOCKERFILE, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		if (strstr(line, "debian:trixie") && (!strncmp(line, "ARG", 3) || !strncmp(line, "FROM", 4)))
			trixie = true;
		if (!strncmp(line, "COPY --from=build", 17) && strstr(line, "/usr/local/bin"))
			bin = true;
		if (!strncmp(line, "USER ", 5)) {
			snprintf(last_user, sizeof(last_user), "%s", line + 5);
			user = last_user;
		}
	}
	fclose(f);
	cr_assert(trixie, "the image is not built on Debian 13 (trixie)");
	cr_assert(bin, "the binaries are not copied to /usr/local/bin");
	cr_assert_not_null(user, "the image has no USER");
	cr_assert(strcmp(user, "root") && strncmp(user, "0", 1) && strncmp(user, "root:", 5),
		  "the image's default USER is root");
}

/* Issue 13: no keys in the pod; its ServiceAccount names an IAM role (IRSA). */
Test(deploy, workload_takes_aws_credentials_from_its_service_account)
{
	const struct ydoc *pod = find_doc(&set, "Pod", NULL);
	const struct ynode *spec = pod_spec(pod), *ann, *lists[2];
	const char *sa = ypath_str(spec, "serviceAccountName"), *role;

	cr_assert_not_null(sa, "the pod names no serviceAccountName");
	ann = ypath(find_doc(&set, "ServiceAccount", sa)->root, "metadata.annotations");
	role = ystr(yget(ann, "eks.amazonaws.com/role-arn"));
	cr_assert(role && !strncmp(role, "arn:aws:iam::", 13) && strstr(role, ":role/"),
		  "ServiceAccount %s has no eks.amazonaws.com/role-arn annotation naming a role", sa);
	lists[0] = yget(spec, "initContainers");
	lists[1] = yget(spec, "containers");
	for (int l = 0; l < 2; l++) {
		for (size_t i = 0; i < yseq_len(lists[l]); i++) {
			const struct ynode *c = lists[l]->kids[i], *env = yget(c, "env"),
					   *from = yget(c, "envFrom");

			for (size_t j = 0; j < yseq_len(from); j++)
				cr_assert_null(yget(from->kids[j], "secretRef"),
					       "container %s takes its environment from a Secret",
					       ypath_str(c, "name"));
			for (size_t j = 0; j < yseq_len(env); j++) {
				const char *n = ypath_str(env->kids[j], "name");

				cr_assert(!n || (strcmp(n, "AWS_ACCESS_KEY_ID") && strcmp(n, "AWS_SECRET_ACCESS_KEY")),
					  "container %s is given static AWS keys", ypath_str(c, "name"));
			}
		}
	}
}
