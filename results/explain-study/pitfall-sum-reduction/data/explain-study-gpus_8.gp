# explain-study-gpus_8, drawn by dtrain report; to restyle, edit and run in this folder: gnuplot explain-study-gpus_8.gp
# Titles are read as data from explain-study-gpus_8.strings into s0, s1, ...
s0 = ""
stats 'explain-study-gpus_8.strings' index 0 using (s0 = s0 . ($1 > 0 ? sprintf("%c", int($1)) : ""), 0) nooutput
set datafile missing '?'
set terminal pngcairo size 1100,600 font 'sans,11' noenhanced
set output 'explain-study-gpus_8.png'
set title s0
set ylabel 'change in final test accuracy (points) from the rung before'
set xtics ('equivalent' 0, 'global_batch' 1, 'lr_rule' 2, 'reduction' 3) rotate by -30
set xrange [-0.6:3.6]
set grid ytics
set style fill solid 0.7 border -1
set boxwidth 0.6
set key top right
set xzeroaxis lt -1
plot 'explain-study-gpus_8.dat' using 1:($4 > 0 ? NaN : $2) with boxes lc rgb '#3465a4' title 'change', 'explain-study-gpus_8.dat' using 1:($4 > 0 ? $2 : NaN) with boxes fs pattern 4 lc rgb '#888a85' title 'not distinguishable (p >= 0.05)', 'explain-study-gpus_8.dat' using 1:2:3 with yerrorbars lc rgb 'black' pt 0 title '95% CI'
set output
set terminal svg size 1100,600 font 'sans,11' noenhanced
set output 'explain-study-gpus_8.svg'
set title s0
set ylabel 'change in final test accuracy (points) from the rung before'
set xtics ('equivalent' 0, 'global_batch' 1, 'lr_rule' 2, 'reduction' 3) rotate by -30
set xrange [-0.6:3.6]
set grid ytics
set style fill solid 0.7 border -1
set boxwidth 0.6
set key top right
set xzeroaxis lt -1
plot 'explain-study-gpus_8.dat' using 1:($4 > 0 ? NaN : $2) with boxes lc rgb '#3465a4' title 'change', 'explain-study-gpus_8.dat' using 1:($4 > 0 ? $2 : NaN) with boxes fs pattern 4 lc rgb '#888a85' title 'not distinguishable (p >= 0.05)', 'explain-study-gpus_8.dat' using 1:2:3 with yerrorbars lc rgb 'black' pt 0 title '95% CI'
set output
