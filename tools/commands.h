/*
 * commands.h -- the subcommands of the `nabla` program, one source file each.
 */
#ifndef NABLA_TOOLS_COMMANDS_H
#define NABLA_TOOLS_COMMANDS_H

/* `nabla train [options]` (train.c); argv holds the options only. Returns the exit code. */
int nabla_cmd_train(int argc, char **argv);

#endif
