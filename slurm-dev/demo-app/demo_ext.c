/* The demo job's compiled dependency: a C extension built at install time, as many
 * real installs build one from an sdist. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *train_step(PyObject *self, PyObject *args)
{
	long n, i;
	double loss = 1.0;

	if (!PyArg_ParseTuple(args, "l", &n))
		return NULL;
	for (i = 0; i < n; i++)
		loss *= 0.999;
	return PyFloat_FromDouble(loss);
}

static PyMethodDef methods[] = {
	{"train_step", train_step, METH_VARARGS, "One (tiny) training step; returns the loss."},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "demo_ext", NULL, -1, methods};

PyMODINIT_FUNC PyInit_demo_ext(void)
{
	return PyModule_Create(&module);
}
