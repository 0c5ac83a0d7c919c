/*
 * bootseer SPANK plugin: option plumbing only.
 *
 * Submit side (sbatch/salloc/srun): registers --bootseer[=MODE], --bootseer-image,
 * --bootseer-deps and --bootseer-ckpt, checks each value against the syntax documented
 * in lib/bootseer/options.py (a bad value fails the submission with a message naming
 * the option), refuses what the site cannot serve where that can be known at submit time (a
 * relative image path, a missing image or key= file, a checkpoint namespace on a site whose
 * config has no [ckpt] targets), and copies the checked values into the job control
 * environment, which Slurm hands to the Prolog/Epilog as SPANK_BOOTSEER_*.
 *
 * Node side (slurmstepd): reads <rundir>/jobs/<jobid>/env, written by the prolog (root's,
 * 0600), while still root, and sets its BOOTSEER_* variables in the tasks' environment, unsetting
 * each other one the prolog may write (env_names): a task never keeps another node's value
 * that srun passed on. lib/bootseer/nodepaths.py
 * names that path for Python; tests/unit/test_nodepaths.py builds expand_node() and
 * job_env_path() below and holds them to its answers. The file's first line names the
 * contract the hooks wrote it under (ENV_CONTRACT); a file this plugin cannot use (another
 * contract, not root's, unreadable) is said so in the slurmd log and on the stderr of each
 * step's first task on the node, never passed over in silence.
 *
 * plugstack.conf arguments: rundir=PATH (default /run/bootseer, as the site config's
 * paths.run_dir; "%n" stands for the short host name, which is the node name).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <slurm/spank.h>

SPANK_PLUGIN(bootseer, 1);

#define MAX_PATH_LEN 1024
#define MAX_NAMESPACE_LEN 256
/* The job's env file under run_dir: nodepaths.job_env (JOBS, JOB_ENV). */
#define JOB_ENV_FORMAT "%s/jobs/%u/env"

/*
 * What the plugin and the hooks agree on (nodepaths.ENV_CONTRACT): where the env file is,
 * who may read it, its format. Raised whenever the two must change together; the env
 * file's first line is ENV_HEADER and the contract the hooks wrote it under, and `bootseer
 * doctor` finds PLUGIN_CONTRACT in the installed plugin file (doctor.plugin_contract).
 */
#define ENV_CONTRACT 2
#define ENV_HEADER "#bootseer-env "

/*
 * Every variable the prolog may write into the env file (nodepaths.ENV_NAMES; the hooks
 * write no other, tests/base/test_nodepaths.py holds the two lists equal). A step's tasks
 * get exactly their own node's: each of these the node's file does not set is unset, not
 * left as srun or sbatch passed it from another node, or from an earlier job (a technique
 * whose step failed on this node, a node whose prolog wrote no file).
 */
static const char *const env_names[] = {
	"BOOTSEER_AGENT_SOCKET", "BOOTSEER_CKPT",  "BOOTSEER_DEPS_KEY",    "BOOTSEER_DEPS_PREFIX",
	"BOOTSEER_IMAGE",	 "BOOTSEER_IMAGE_REF", "BOOTSEER_NOTICE", "BOOTSEER_PHASE_MARKS",
	NULL};
#define STR_(x) #x
#define STR(x) STR_(x)
__attribute__((used)) static const char plugin_contract[] =
	"bootseer-spank-contract=" STR(ENV_CONTRACT) ";";

static char *opt_mode;
static char *opt_image;
static char *opt_deps;
static char *opt_ckpt;
static int opt_used;
static char run_dir[PATH_MAX] = "/run/bootseer";

static int path_chars_ok(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (!isalnum((unsigned char)s[i]) && !strchr("._/+@:-", s[i]))
			return 0;
	}
	return 1;
}

/* No component of the path is "." or "..". */
static int components_ok(const char *s, size_t n)
{
	size_t start = 0;
	for (size_t i = 0; i <= n; i++) {
		if (i == n || s[i] == '/') {
			size_t len = i - start;
			if ((len == 1 && s[start] == '.') ||
			    (len == 2 && s[start] == '.' && s[start + 1] == '.'))
				return 0;
			start = i + 1;
		}
	}
	return 1;
}

static int path_ok(const char *s, size_t n, int absolute)
{
	if (n == 0 || n > MAX_PATH_LEN || !path_chars_ok(s, n) || !components_ok(s, n))
		return 0;
	return !absolute || s[0] == '/';
}

static int span_of(const char *s, size_t n, const char *extra)
{
	for (size_t i = 0; i < n; i++) {
		if (!isalnum((unsigned char)s[i]) && !strchr(extra, s[i]))
			return 0;
	}
	return 1;
}

static int check_mode(const char *v)
{
	if (v == NULL || *v == '\0' || !strcmp(v, "on") || !strcmp(v, "off") ||
	    !strcmp(v, "refresh"))
		return 0;
	slurm_error("bootseer: --bootseer=%s: MODE must be one of on, off, refresh", v);
	return -1;
}

static int check_image(const char *v)
{
	size_t n = strlen(v);
	if (v[0] == '/') {
		if (path_ok(v, n, 1))
			return 0;
	} else {
		const char *colon = strchr(v, ':');
		size_t name_len = colon ? (size_t)(colon - v) : n;
		int name_ok = name_len >= 1 && name_len <= 128 &&
			      (islower((unsigned char)v[0]) || isdigit((unsigned char)v[0]));
		for (size_t i = 0; name_ok && i < name_len; i++)
			name_ok = islower((unsigned char)v[i]) || isdigit((unsigned char)v[i]) ||
				  strchr("._-", v[i]);
		int tag_ok = !colon || (strlen(colon + 1) >= 1 && strlen(colon + 1) <= 128 &&
					span_of(colon + 1, strlen(colon + 1), "._-"));
		if (name_ok && tag_ok)
			return 0;
	}
	slurm_error("bootseer: --bootseer-image=%s: give an absolute path to a squashfs file "
		    "(characters A-Z a-z 0-9 . _ - / + @ :, no '.' or '..' parts) or a registered "
		    "image NAME[:TAG] (NAME: a-z 0-9 . _ -)", v);
	return -1;
}

static int check_deps(const char *v)
{
	const char *item = v;
	int first = 1;
	const char *why = NULL;

	while (why == NULL) {
		const char *end = strchr(item, ',');
		size_t n = end ? (size_t)(end - item) : strlen(item);
		if (first) {
			if (n >= 7 && !strncmp(item, "prefix=", 7)) {
				item += 7;
				n -= 7;
			}
			if (!path_ok(item, n, 1) || (n == 1 && item[0] == '/'))
				why = "PREFIX must be an absolute path other than /";
		} else if (n >= 4 && !strncmp(item, "key=", 4)) {
			if (!path_ok(item + 4, n - 4, 0))
				why = "key=FILE must be a path of A-Z a-z 0-9 . _ - / + @ : without '.' "
				      "or '..' parts";
		} else if (n >= 6 && !strncmp(item, "scope=", 6)) {
			if (!((n == 10 && !strncmp(item + 6, "user", 4)) ||
			      (n == 13 && !strncmp(item + 6, "account", 7)) ||
			      (n == 13 && !strncmp(item + 6, "cluster", 7))))
				why = "scope must be one of user, account, cluster";
		} else {
			why = "after PREFIX only key=FILE and scope=SCOPE may follow";
		}
		first = 0;
		if (!end)
			break;
		item = end + 1;
	}
	if (why == NULL)
		return 0;
	slurm_error("bootseer: --bootseer-deps=%s: %s (syntax: PREFIX[,key=FILE]...[,scope=user|"
		    "account|cluster])", v, why);
	return -1;
}

static int check_ckpt(const char *v)
{
	size_t n = strlen(v);
	if (n >= 1 && n <= MAX_NAMESPACE_LEN && v[0] != '/' && v[n - 1] != '/' &&
	    !strstr(v, "//") && span_of(v, n, "._-/") && components_ok(v, n))
		return 0;
	slurm_error("bootseer: --bootseer-ckpt=%s: NAMESPACE is a relative name of A-Z a-z 0-9 "
		    ". _ - parts joined by '/', without '.' or '..' parts, up to %d characters",
		    v, MAX_NAMESPACE_LEN);
	return -1;
}

/*
 * Submit side: what can be known before the job exists is refused here, with a message
 * naming the option (issue 22): a relative image path (a file of that name where the job
 * is submitted: a bare NAME is a registered image), an image or key= file that is not
 * there, a checkpoint namespace on a site with no checkpoint storage. Only where a new job
 * is submitted (sbatch, salloc, an srun of its own allocation): an srun inside a job
 * re-reads the job's options on a compute node, which need not see the submit host's
 * files. What only the prolog can know is said on the job's stderr (BOOTSEER_NOTICE).
 */
static int submitting(void)
{
	spank_context_t ctx = spank_context();
	return ctx == S_CTX_ALLOCATOR || (ctx == S_CTX_LOCAL && getenv("SLURM_JOB_ID") == NULL);
}

/* 1 when path is missing where its directory is there to look (a share not mounted on
 * the submit host is not the user's mistake: the prolog says it). */
static int surely_missing(const char *path)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	struct stat st;

	if (stat(path, &st) == 0 || errno != ENOENT)
		return 0;
	if (slash == NULL)
		return 1; /* relative to the submit directory, which is there */
	snprintf(dir, sizeof(dir), "%.*s", (int)(slash == path ? 1 : slash - path), path);
	return stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

static int image_servable(const char *v)
{
	struct stat st;
	char cwd[PATH_MAX];

	if (v[0] != '/') {
		if (stat(v, &st) == 0 && !S_ISDIR(st.st_mode)) {
			slurm_error("bootseer: --bootseer-image=%s: a file of that name is here, but "
				    "a value without a leading / names a registered image: give the "
				    "file's absolute path (--bootseer-image=%s/%s)",
				    v, getcwd(cwd, sizeof(cwd)) ? cwd : ".", v);
			return -1;
		}
		return 0;
	}
	if (surely_missing(v)) {
		slurm_error("bootseer: --bootseer-image=%s: no such file", v);
		return -1;
	}
	return 0;
}

static int deps_servable(const char *v)
{
	const char *item = strchr(v, ',');
	char key[MAX_PATH_LEN + 1];

	while (item != NULL) {
		const char *end = strchr(item + 1, ',');
		size_t n = end ? (size_t)(end - item - 1) : strlen(item + 1);
		if (n > 4 && n - 4 <= MAX_PATH_LEN && !strncmp(item + 1, "key=", 4)) {
			snprintf(key, sizeof(key), "%.*s", (int)(n - 4), item + 5);
			if (surely_missing(key)) {
				slurm_error("bootseer: --bootseer-deps=%s: key file %s: no such file%s", v,
					    key, key[0] == '/' ? "" : " (relative to the submit directory)");
				return -1;
			}
		}
		item = end;
	}
	return 0;
}

/*
 * Whether the site config (what $BOOTSEER_CONFIG names, else /etc/bootseer/config.toml,
 * as bootseer.config reads it) gives [ckpt] targets: 1 yes, 0 no, -1 cannot tell (no
 * file, a form this small reader does not follow). Only a sure 0 refuses a job.
 */
static int site_ckpt_targets(const char *path)
{
	char line[4096];
	int in_ckpt = 0, open_list = 0, answer = -2;
	FILE *f = fopen(path, "re");

	if (f == NULL)
		return -1;
	while (answer == -2 && fgets(line, sizeof(line), f)) {
		char *p = line + strspn(line, " \t");
		if (open_list) { /* targets = [ on a line of its own: its first item, or ] */
			if (*p == '\0' || *p == '\n' || *p == '#')
				continue;
			answer = *p != ']';
		} else if (*p == '[') {
			in_ckpt = !strncmp(p, "[ckpt]", 6);
		} else if (!strncmp(p, "ckpt.targets", 12) || !strncmp(p, "ckpt =", 6) ||
			   !strncmp(p, "ckpt=", 5)) {
			answer = -1; /* a dotted key or an inline table: not followed here */
		} else if (in_ckpt && !strncmp(p, "targets", 7)) {
			p += 7 + strspn(p + 7, " \t");
			if (*p != '=')
				continue;
			p += 1 + strspn(p + 1, " \t");
			if (*p != '[') {
				answer = -1;
				break;
			}
			p += 1 + strspn(p + 1, " \t");
			if (*p == '\0' || *p == '\n' || *p == '#')
				open_list = 1;
			else
				answer = *p != ']';
		}
	}
	fclose(f);
	return answer == -2 ? (open_list ? -1 : 0) : answer;
}

static int ckpt_servable(const char *v)
{
	const char *path = getenv("BOOTSEER_CONFIG");
	if (path == NULL || *path == '\0')
		path = "/etc/bootseer/config.toml";
	if (site_ckpt_targets(path) != 0)
		return 0;
	slurm_error("bootseer: --bootseer-ckpt=%s: this site has no checkpoint storage ([ckpt] "
		    "targets is empty in %s): submit without --bootseer-ckpt", v, path);
	return -1;
}

static int keep(char **slot, const char *v, int (*check)(const char *))
{
	if (check(v ? v : "") < 0)
		return -1;
	free(*slot);
	*slot = v ? strdup(v) : NULL;
	opt_used = 1;
	return 0;
}

static int cb_mode(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	/* Slurm hands a job step an optional argument that was never given as "(null)". */
	if (optarg && !strcmp(optarg, "(null)"))
		optarg = NULL;
	if (check_mode(optarg) < 0)
		return -1;
	free(opt_mode);
	opt_mode = strdup(optarg && *optarg ? optarg : "on");
	opt_used = 1;
	return 0;
}

static int cb_image(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	return keep(&opt_image, optarg, check_image);
}

static int cb_deps(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	return keep(&opt_deps, optarg, check_deps);
}

static int cb_ckpt(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	return keep(&opt_ckpt, optarg, check_ckpt);
}

static struct spank_option options[] = {
	{"bootseer", "[MODE]",
	 "Speed up this job's start with bootseer. MODE: on (default), refresh (record anew), off",
	 2, 0, cb_mode},
	{"bootseer-image", "IMAGE",
	 "[bootseer] container image: /abs/path/to/image.sqsh or a registered NAME[:TAG]", 1, 0,
	 cb_image},
	{"bootseer-deps", "SPEC",
	 "[bootseer] dependency snapshot: PREFIX[,key=FILE]...[,scope=user|account|cluster]", 1, 0,
	 cb_deps},
	{"bootseer-ckpt", "SPEC",
	 "[bootseer] striped checkpoint NAMESPACE, mounted at $BOOTSEER_CKPT", 1, 0, cb_ckpt},
	SPANK_OPTIONS_TABLE_END};

static int parse_args(int ac, char **av)
{
	for (int i = 0; i < ac; i++) {
		if (!strncmp(av[i], "rundir=", 7) && av[i][7] == '/' &&
		    strlen(av[i] + 7) < sizeof(run_dir)) {
			snprintf(run_dir, sizeof(run_dir), "%s", av[i] + 7);
		} else {
			slurm_error("bootseer: unknown plugstack argument '%s' (known: rundir=/PATH)",
				    av[i]);
			return -1;
		}
	}
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	spank_context_t ctx = spank_context();
	if (parse_args(ac, av) < 0)
		return -1;
	if (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR && ctx != S_CTX_REMOTE)
		return 0;
	for (struct spank_option *o = options; o->name; o++) {
		if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
			slurm_error("bootseer: cannot register --%s", o->name);
			return -1;
		}
	}
	return 0;
}

/* Submit side: hand the checked options to the Prolog/Epilog. */
static int export_to_hooks(spank_t sp)
{
	char cwd[PATH_MAX];
	if (!opt_used)
		return 0;
	if (opt_mode == NULL)
		opt_mode = strdup("on");
	if (!strcmp(opt_mode, "off"))
		return 0;
	if (submitting() && ((opt_image && image_servable(opt_image) < 0) ||
			     (opt_deps && deps_servable(opt_deps) < 0) ||
			     (opt_ckpt && ckpt_servable(opt_ckpt) < 0)))
		return -1;
	spank_job_control_setenv(sp, "BOOTSEER_MODE", opt_mode, 1);
	if (opt_image)
		spank_job_control_setenv(sp, "BOOTSEER_IMAGE", opt_image, 1);
	if (opt_deps)
		spank_job_control_setenv(sp, "BOOTSEER_DEPS", opt_deps, 1);
	if (opt_ckpt)
		spank_job_control_setenv(sp, "BOOTSEER_CKPT", opt_ckpt, 1);
	/* Relative key files in --bootseer-deps are relative to where the job was submitted. */
	if (getcwd(cwd, sizeof(cwd)))
		spank_job_control_setenv(sp, "BOOTSEER_WORKDIR", cwd, 1);
	return 0;
}

/* template with every "%n" replaced by node (nodepaths.expand); -1 if it does not fit. */
static int expand_node(char *out, size_t size, const char *template, const char *node)
{
	size_t n = 0, len = strlen(node);
	for (const char *p = template; *p; p++) {
		const char *piece = p;
		size_t k = 1;
		if (p[0] == '%' && p[1] == 'n') {
			piece = node;
			k = len;
			p++;
		}
		if (n + k >= size)
			return -1;
		memcpy(out + n, piece, k);
		n += k;
	}
	out[n] = '\0';
	return 0;
}

/* The job's env file on this node, from run_dir with "%n" expanded (nodepaths.job_env). */
static int job_env_path(char *out, size_t size, const char *run_dir_template, const char *node,
			uint32_t job_id)
{
	char dir[PATH_MAX];
	if (expand_node(dir, sizeof(dir), run_dir_template, node) < 0)
		return -1;
	return snprintf(out, size, JOB_ENV_FORMAT, dir, job_id) < (int)size ? 0 : -1;
}

/*
 * The node name for "%n": the short host name (nodepaths.host_name). The job's
 * environment is the user's to change (SLURMD_NODENAME included), the host name is not.
 * slurm-dev runs each slurmd in a UTS namespace of its own whose host name is the node name.
 */
static int host_name(char *out, size_t size)
{
	if (gethostname(out, size - 1) < 0)
		return -1;
	out[size - 1] = '\0';
	out[strcspn(out, ".")] = '\0';
	return 0;
}

/*
 * Node side, in three callbacks. The env file is root's alone (0600): it names the job's
 * image, checkpoint namespace and deps prefix, which other users of the node must not
 * read. slurmstepd calls init_post_opt as root and user_init after it has dropped to the
 * job's user (spank.h), so the file is read into job_env in the first and its variables
 * set in the second. What kept the file from the tasks is in env_problem, for task_init
 * to write on the first task's stderr (the job's output) just before it runs.
 */
static char job_env[65536];
static size_t job_env_len;
static char env_problem[PATH_MAX + 64 + 512 + 64];

/* A file the plugin cannot use: into the slurmd log now, the job's stderr later. */
static void env_unusable(const char *path, const char *why)
{
	snprintf(env_problem, sizeof(env_problem),
		 "bootseer: BOOTSEER_* variables not set: %s: %s", path, why);
	slurm_error("%s", env_problem);
}

/* The contract in the file's first line (job_env), or -1 without one; the body after it. */
static long env_contract(char **body)
{
	char *end;
	long contract;

	*body = job_env;
	if (strncmp(job_env, ENV_HEADER, strlen(ENV_HEADER)))
		return -1;
	contract = strtol(job_env + strlen(ENV_HEADER), &end, 10);
	if (*end != '\n' || contract < 0)
		return -1;
	*body = end + 1;
	return contract;
}

/*
 * What the prolog says the job asked for and did not get on this node (a technique whose
 * step failed): BOOTSEER_NOTICE in the env file, one line, said on the stderr of the first
 * task of the job's first step on the node (notice_due), not of every step: the job dir's
 * NOTICE_TOLD file, made as root with O_EXCL, says a step already said it.
 */
static char notice[1024];
static int notice_due;
#define NOTICE_TOLD "notice-told"

/* As root: whether this step is the one that tells the job (the first to ask). */
static int first_to_tell(const char *env_path)
{
	char told[PATH_MAX + 64];
	const char *slash = strrchr(env_path, '/');
	int fd;

	if (slash == NULL ||
	    snprintf(told, sizeof(told), "%.*s/%s", (int)(slash - env_path), env_path, NOTICE_TOLD) >=
		    (int)sizeof(told))
		return 1;
	fd = open(told, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0) {
		close(fd);
		return 1;
	}
	return errno != EEXIST; /* cannot tell whether a step said it: say it again */
}

/* As root: read the job's env file (if the prolog wrote one) into job_env. */
static int read_from_prolog(spank_t sp)
{
	uint32_t job_id;
	char host[256], path[PATH_MAX + 64], why[512];
	struct stat st;
	size_t n;
	long contract;
	char *body;
	FILE *f;
	int fd;

	job_env_len = 0;
	env_problem[0] = '\0';
	notice[0] = '\0';
	notice_due = 0;
	if (spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS ||
	    host_name(host, sizeof(host)) < 0 ||
	    job_env_path(path, sizeof(path), run_dir, host, job_id) < 0)
		return 0;
	/*
	 * As root: never through a link (another job's env file), never blocked on a FIFO
	 * (slurmstepd would hang); what is not a regular file of root's is refused below.
	 */
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ELOOP)
			env_unusable(path, "a symbolic link: ignored");
		else if (errno != ENOENT) /* ENOENT: bootseer not asked for, or the prolog failed */
			env_unusable(path, strerror(errno));
		return 0;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022)) {
		env_unusable(path, "not a file of root's, or writable by others: ignored");
		close(fd);
		return 0;
	}
	f = fdopen(fd, "r");
	if (f == NULL) {
		env_unusable(path, strerror(errno));
		close(fd);
		return 0;
	}
	n = fread(job_env, 1, sizeof(job_env) - 1, f);
	if (ferror(f) || !feof(f)) {
		snprintf(why, sizeof(why), "%s than %zu bytes", ferror(f) ? "read error, or larger" : "larger",
			 sizeof(job_env) - 1);
		env_unusable(path, why);
		fclose(f);
		return 0;
	}
	fclose(f);
	job_env[n] = '\0';
	contract = env_contract(&body);
	if (contract != ENV_CONTRACT) {
		if (contract < 0)
			snprintf(why, sizeof(why),
				 "written by bootseer hooks older than this plugin (no contract line); "
				 "this plugin reads contract %d: install bootseer and its plugin together "
				 "(bootseer install), then bootseer doctor", ENV_CONTRACT);
		else
			snprintf(why, sizeof(why),
				 "written under contract %ld, this plugin reads contract %d: install "
				 "bootseer and its plugin together (bootseer install), then bootseer doctor",
				 contract, ENV_CONTRACT);
		env_unusable(path, why);
		return 0;
	}
	n -= (size_t)(body - job_env);
	memmove(job_env, body, n + 1);
	job_env_len = n;
	notice_due = (strncmp(job_env, "BOOTSEER_NOTICE=", 16) == 0 ||
		      strstr(job_env, "\nBOOTSEER_NOTICE=") != NULL) &&
		     first_to_tell(path);
	return 0;
}

/*
 * As the job's user: put what the prolog prepared on this node into the tasks'
 * environment, and nothing else of env_names: first every one of them goes, then the
 * file's come back.
 */
static int import_from_prolog(spank_t sp)
{
	char *line = job_env, *next;

	for (const char *const *name = env_names; *name; name++) {
		spank_err_t rc = spank_unsetenv(sp, *name);
		if (rc != ESPANK_SUCCESS && rc != ESPANK_ENV_NOEXIST)
			slurm_error("bootseer: cannot unset %s: %s", *name, spank_strerror(rc));
	}
	for (; job_env_len && line < job_env + job_env_len; line = next) {
		char *eq;
		next = line + strcspn(line, "\n");
		if (*next)
			*next++ = '\0';
		eq = strchr(line, '=');
		if (eq == NULL || strncmp(line, "BOOTSEER_", 9))
			continue;
		*eq = '\0';
		if (strcmp(line, "BOOTSEER_NOTICE") == 0 && notice_due)
			snprintf(notice, sizeof(notice), "%s", eq + 1);
		if (spank_setenv(sp, line, eq + 1, 1) != ESPANK_SUCCESS)
			slurm_error("bootseer: cannot set %s", line);
	}
	job_env_len = 0;
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_context() == S_CTX_LOCAL || spank_context() == S_CTX_ALLOCATOR)
		return export_to_hooks(sp);
	if (spank_context() == S_CTX_REMOTE)
		return read_from_prolog(sp); /* slurmstepd, still root */
	return 0;
}

/* Every step, the batch script's included, once its environment is set up (as the user). */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	return import_from_prolog(sp);
}

/*
 * In each task, as the job's user, just before it runs: the first task of the step on
 * this node says on its stderr (the job's output) why the step has no BOOTSEER_* variables;
 * the first task of the job's first step on the node, which technique the job asked for
 * and does not have on this node.
 */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	uint32_t task_id;
	(void)ac;
	(void)av;
	if (!env_problem[0] && !notice[0])
		return 0;
	if (spank_get_item(sp, S_TASK_ID, &task_id) != ESPANK_SUCCESS || task_id != 0)
		return 0;
	if (env_problem[0])
		dprintf(STDERR_FILENO, "%s\n", env_problem);
	if (notice[0])
		dprintf(STDERR_FILENO, "%s\n", notice);
	return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void)sp;
	(void)ac;
	(void)av;
	free(opt_mode);
	free(opt_image);
	free(opt_deps);
	free(opt_ckpt);
	opt_mode = opt_image = opt_deps = opt_ckpt = NULL;
	return 0;
}
