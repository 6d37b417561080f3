"""Files from the cluster, read as data: bounded, streamed, never code, never outside a folder.

Every importer reads what ranks wrote into shared folders through these modules: bounded and
streamed reads and decompression (:mod:`.bounded_read`, ``--max-file-mb``), the files of a
folder without symlinks out of it (:mod:`.folder_files`), pickles of plain data only
(:mod:`.plain_unpickle`), and an error message, never a traceback (:mod:`.clear_errors`).

May import: the core (``rankscope``) and itself.
"""
