/*
 * url.c: storage URLs and metadata locations, valid and hostile.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>

#include "url.h"

static void
parse_ok(const char *s, int s3_http, struct store_url *u)
{
	char err[256] = "";
	int r = store_url_parse(s, s3_http, u, err, sizeof(err));

	cr_assert_eq(r, 0, "\"%s\": %d %s", s, r, err);
	cr_assert_str_empty(err);
}

static void
parse_bad(const char *s)
{
	struct store_url u;
	char err[256] = "";
	int r;

	memset(&u, 0xa5, sizeof(u));
	r = store_url_parse(s, 0, &u, err, sizeof(err));
	cr_assert_eq(r, -EINVAL, "\"%s\" was accepted (%d)", s ? s : "(null)", r);
	cr_assert(strlen(err) > 10, "\"%s\": no reason given", s ? s : "(null)");
	/* Nothing half-filled is left behind. */
	cr_assert_null(u.path);
	cr_assert_null(u.host);
	cr_assert_null(u.bucket);
	cr_assert_null(u.prefix);
	store_url_free(&u);
}

Test(store_url, file_urls)
{
	struct store_url u;

	parse_ok("file:///var/lib/ferry/objects", 0, &u);
	cr_assert_eq(u.kind, STORE_FILE);
	cr_assert_str_eq(u.path, "/var/lib/ferry/objects");
	store_url_free(&u);

	parse_ok("file:///a//b/./c///", 0, &u);
	cr_assert_str_eq(u.path, "/a/b/c");
	store_url_free(&u);
	store_url_free(&u); /* twice is fine */
}

Test(store_url, s3_urls)
{
	struct store_url u;

	parse_ok("s3://127.0.0.1:9000/bucket", 0, &u);
	cr_assert_eq(u.kind, STORE_S3);
	cr_assert_str_eq(u.host, "127.0.0.1");
	cr_assert_eq(u.port, 9000);
	cr_assert_str_eq(u.bucket, "bucket");
	cr_assert_str_eq(u.prefix, "");
	cr_assert_eq(u.https, 1);
	store_url_free(&u);

	parse_ok("s3://s3.eu-west-1.amazonaws.com/my.bucket-1/vol/a/", 0, &u);
	cr_assert_str_eq(u.host, "s3.eu-west-1.amazonaws.com");
	cr_assert_eq(u.port, 443);
	cr_assert_str_eq(u.bucket, "my.bucket-1");
	cr_assert_str_eq(u.prefix, "vol/a");
	store_url_free(&u);

	parse_ok("s3://minio/bkt/", 1, &u);
	cr_assert_eq(u.port, 80);
	cr_assert_eq(u.https, 0);
	cr_assert_str_eq(u.prefix, "");
	store_url_free(&u);

	parse_ok("s3://[::1]:4568/bkt/p", 1, &u);
	cr_assert_str_eq(u.host, "[::1]");
	cr_assert_eq(u.port, 4568);
	cr_assert_str_eq(u.prefix, "p");
	store_url_free(&u);

	parse_ok("s3://h:65535/bkt", 0, &u);
	cr_assert_eq(u.port, 65535);
	store_url_free(&u);
}

Test(store_url, aws_and_endpoint_forms_and_options)
{
	struct store_url u;

	/* A region and no host: AWS's virtual-hosted HTTPS endpoint. */
	parse_ok("s3://my-bucket/vol/a?region=eu-west-1", 0, &u);
	cr_assert_str_eq(u.host, "my-bucket.s3.eu-west-1.amazonaws.com");
	cr_assert_eq(u.port, 443);
	cr_assert_eq(u.https, 1);
	cr_assert_eq(u.virtual_hosted, 1);
	cr_assert_str_eq(u.bucket, "my-bucket");
	cr_assert_str_eq(u.prefix, "vol/a");
	cr_assert_str_eq(u.region, "eu-west-1");
	cr_assert_eq(u.max_retries, -1);
	cr_assert_eq(u.timeout_ms, 0);
	store_url_free(&u);

	/* China's partition; %-encoded numbers. */
	parse_ok("s3://my-bucket?region=cn-north-1&timeout_ms=%31000", 0, &u);
	cr_assert_str_eq(u.host, "my-bucket.s3.cn-north-1.amazonaws.com.cn");
	cr_assert_eq(u.virtual_hosted, 1);
	cr_assert_str_eq(u.prefix, "");
	cr_assert_eq(u.timeout_ms, 1000);
	store_url_free(&u);

	/* A custom endpoint for the bucket, path-style, and every option. */
	parse_ok("s3://bkt/p?endpoint=http://minio.local:9000&sse=aws%3Akms&sse_kms_key_id="
		 "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab&storage_class=STANDARD_IA&"
		 "expected_owner=111122223333&timeout_ms=5000&max_retries=0&region=us-west-2", 0, &u);
	cr_assert_str_eq(u.host, "minio.local");
	cr_assert_eq(u.port, 9000);
	cr_assert_eq(u.https, 0);
	cr_assert_eq(u.virtual_hosted, 0);
	cr_assert_str_eq(u.bucket, "bkt");
	cr_assert_str_eq(u.sse, "aws:kms");
	cr_assert_str_eq(u.sse_kms_key_id, "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab");
	cr_assert_str_eq(u.storage_class, "STANDARD_IA");
	cr_assert_str_eq(u.expected_owner, "111122223333");
	cr_assert_eq(u.timeout_ms, 5000);
	cr_assert_eq(u.max_retries, 0);
	cr_assert_str_eq(u.region, "us-west-2");
	store_url_free(&u);

	/* A host and port with options: the old form, options kept. */
	parse_ok("s3://127.0.0.1:9000/bkt?region=eu-west-1&sse=AES256", 1, &u);
	cr_assert_str_eq(u.host, "127.0.0.1");
	cr_assert_str_eq(u.bucket, "bkt");
	cr_assert_str_eq(u.sse, "AES256");
	cr_assert_str_eq(u.region, "eu-west-1");
	store_url_free(&u);
}

Test(store_url, rejects_options_it_would_not_act_on)
{
	static const char *bad[] = {
		"s3://bkt?region=", "s3://bkt?region=EU", "s3://bkt?region=eu west", "s3://bkt?bogus=1",
		"s3://bkt?region", "s3://bkt?=x", "s3://bkt?region=a&region=b", "s3://bkt?sse=rot13",
		"s3://h:1/bkt?sse_kms_key_id=k", "s3://bkt?region=x&expected_owner=123",
		"s3://bkt?region=x&expected_owner=12345678901a", "s3://bkt?region=x&timeout_ms=5",
		"s3://bkt?region=x&max_retries=99", "s3://bkt?region=x&timeout_ms=1e3",
		"s3://bkt?region=x&storage_class=standard", "s3://bkt?endpoint=ftp://h",
		"s3://bkt?endpoint=http://h/path", "s3://bkt?endpoint=http://h:0",
		"s3://h:1/bkt?endpoint=http://x", "s3://Bkt?region=x", "s3://bkt/a//b?region=x",
		"s3://bkt?region=x%", "s3://bkt?region=x%4", "s3://bkt?region=%00x",
		/* A host-looking name is not quietly an AWS bucket. */
		"s3://minio.local/bucket?region=us-east-1", "s3://my.bucket?region=eu-west-1",
		"s3://bkt?region=x&timeout_ms=1000&timeout_ms=2000",
		"s3://bkt?region=x&max_retries=1&max_retries=1", "s3://bkt?region=x&timeout_ms=%201000",
		"s3://bkt?region=x&timeout_ms=+1000",
	};
	struct store_url u;
	char err[256];

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		parse_bad(bad[i]);
	/* AWS's endpoints are HTTPS. */
	cr_assert_eq(store_url_parse("s3://bkt?region=eu-west-1", 1, &u, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "HTTPS"), "%s", err);
	/* The endpoint's scheme says http or https; --s3-http would be ignored. */
	cr_assert_eq(store_url_parse("s3://bkt?endpoint=https://h", 1, &u, err, sizeof(err)), -EINVAL);
	cr_assert(strstr(err, "--s3-http"), "%s", err);
}

Test(store_url, rejects)
{
	static const char *bad[] = {
		"", "garbage", "/abs/dir", "http://h/b", "S3://h/b", "file:", "file://",
		"file://relative/dir", "file://host/dir", "file:///", "file:///a/../b",
		"file:///a/b\n", "s3://", "s3:///bkt", "s3://host", "s3://host/",
		"s3://host//bkt", "s3://host:/bkt", "s3://host:0/bkt", "s3://host:65536/bkt",
		"s3://host:99999999999999999999/bkt", "s3://host:-1/bkt", "s3://host:80a/bkt",
		"s3://ho st/bkt", "s3://host /bkt", "s3://host/bk t", "s3://-host/bkt",
		"s3://host_/bkt", "s3://a..b/bkt", "s3://host/Bucket", "s3://host/b_kt",
		"s3://host/ab", "s3://host/-bkt", "s3://host/bkt-", "s3://user:pw@host/bkt",
		"s3://host/bkt?x=1", "s3://host/bkt#frag", "s3://host/bkt/a//b",
		"s3://host/bkt/../x", "s3://host/bkt/./x", "s3://[::1/bkt", "s3://[::1]x/bkt",
		"s3://[zz]/bkt", "s3://host/bkt\t",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		parse_bad(bad[i]);
	parse_bad(NULL);
}

Test(store_url, short_error_buffer)
{
	struct store_url u;
	char err[8];

	memset(err, 'x', sizeof(err));
	cr_assert_eq(store_url_parse("s3://host:0/bkt", 0, &u, err, sizeof(err)), -EINVAL);
	cr_assert_eq(err[7], '\0');
	cr_assert_eq(store_url_parse("nope", 0, &u, NULL, 0), -EINVAL);
}

Test(store_url, free_zeroed)
{
	struct store_url u = { 0 };

	store_url_free(&u);
	store_url_free(NULL);
}

static void
meta_ok(const char *s, const char *want_db, const char *want_dir)
{
	char err[256] = "", *db = NULL, *dir = NULL;
	int r = meta_url_parse(s, &db, &dir, err, sizeof(err));

	cr_assert_eq(r, 0, "\"%s\": %d %s", s, r, err);
	cr_assert_str_eq(db, want_db, "\"%s\"", s);
	cr_assert_str_eq(dir, want_dir, "\"%s\"", s);
	free(db);
	free(dir);
}

static void
meta_bad(const char *s)
{
	char err[256] = "", *db = (char *)1, *dir = (char *)1;
	int r = meta_url_parse(s, &db, &dir, err, sizeof(err));

	cr_assert_eq(r, -EINVAL, "\"%s\" was accepted", s ? s : "(null)");
	cr_assert(strlen(err) > 10);
	cr_assert_null(db);
	cr_assert_null(dir);
}

Test(meta_url, sqlite_urls)
{
	meta_ok("sqlite:///var/lib/ferry/vol1/meta.db", "/var/lib/ferry/vol1/meta.db", "/var/lib/ferry/vol1");
	meta_ok("sqlite:///x//y/./m.sqlite", "/x/y/m.sqlite", "/x/y");
	meta_ok("sqlite:///meta.db", "/meta.db", "/");
}

Test(meta_url, rejects)
{
	static const char *bad[] = {
		"", "sqlite://", "sqlite://relative/meta.db", "sqlite://meta.db",
		"sqlite:///", "sqlite:///abs/dir/", "sqlite:///a/../b.db", "postgres://h/db",
		"s3://h/b", "vol\ndir",
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		meta_bad(bad[i]);
	meta_bad(NULL);
}

Test(meta_url, volume_dirs)
{
	char tmpl[] = "/tmp/ferry-url-XXXXXX", *real, cwd[PATH_MAX], want_db[PATH_MAX], want_dir[PATH_MAX];
	char link[PATH_MAX];

	cr_assert_not_null(mkdtemp(tmpl));
	real = realpath(tmpl, NULL);
	cr_assert_not_null(real);
	cr_assert_not_null(getcwd(cwd, sizeof(cwd)));
	cr_assert_eq(chdir(tmpl), 0);

	/* Relative, not existing yet. */
	snprintf(want_dir, sizeof(want_dir), "%s/vol", real);
	snprintf(want_db, sizeof(want_db), "%s/vol/meta.db", real);
	meta_ok("vol", want_db, want_dir);
	meta_ok("./vol/", want_db, want_dir);
	meta_ok("x/../vol", want_db, want_dir);

	/* Existing through a symlink: resolved like realpath. */
	cr_assert_eq(mkdir("real", 0755), 0);
	cr_assert_eq(symlink("real", "alias"), 0);
	snprintf(want_dir, sizeof(want_dir), "%s/real/sub", real);
	snprintf(want_db, sizeof(want_db), "%s/real/sub/meta.db", real);
	meta_ok("alias/sub", want_db, want_dir);
	snprintf(link, sizeof(link), "%s/alias/sub", tmpl);
	meta_ok(link, want_db, want_dir);

	/* Absolute, nothing of it exists. */
	meta_ok("/nonexistent-ferry-xyz/a/./b/", "/nonexistent-ferry-xyz/a/b/meta.db", "/nonexistent-ferry-xyz/a/b");
	meta_ok("/", "/meta.db", "/");

	cr_assert_eq(chdir(cwd), 0);
	snprintf(link, sizeof(link), "%s/alias", tmpl);
	unlink(link);
	snprintf(link, sizeof(link), "%s/real", tmpl);
	rmdir(link);
	rmdir(tmpl);
	free(real);
}

/* A PostgreSQL volume: the URL is kept as given; its node directory is
 * $FERRY_STATE_DIR/NAME; what the engine would refuse is refused here, with
 * a reason. */
Test(meta_url, postgresql_urls)
{
	const char *u = "postgresql://ferry@db.example:5432/meta?sslmode=require&volume=vol_1";

	setenv("FERRY_STATE_DIR", "/srv/ferry", 1);
	meta_ok(u, u, "/srv/ferry/vol_1");
	meta_ok("postgres:///meta?volume=a&host=/run/pg", "postgres:///meta?volume=a&host=/run/pg",
		"/srv/ferry/a");
	meta_bad("postgresql://db/meta");                         /* no volume */
	meta_bad("postgresql://db/meta?volume=");                 /* empty name */
	meta_bad("postgresql://db/meta?volume=Upper");            /* not a-z 0-9 _ */
	meta_bad("postgresql://db/meta?volume=a&volume=b");       /* twice */
	meta_bad("postgresql://db/meta?volume=../../etc");        /* a path */
	meta_bad("postgresql://u:secret@db/meta?volume=a");       /* a password */
	meta_bad("postgresql://db/meta?password=secret&volume=a");
	meta_bad("postgresql://u:pw?x@db/meta?volume=a");
	meta_bad("postgresql://db/meta?volume="
		 "a123456789a123456789a123456789a123456789a123456789"); /* 50 > 48 */
	setenv("FERRY_STATE_DIR", "relative/dir", 1);
	meta_bad(u);
	unsetenv("FERRY_STATE_DIR");
}
