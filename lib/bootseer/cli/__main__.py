from bootseer.cli import program

program()
